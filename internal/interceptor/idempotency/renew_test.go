package idempotency_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
)

// renewStore counts the renewals of each key and answers those of keys holding lost as
// the store does for a claim another caller took (store.ErrNotOwner).
type renewStore struct {
	store.Idempotency
	lost string

	mu       sync.Mutex
	renewals map[string]int
}

func (r *renewStore) RenewClaim(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	r.mu.Lock()
	r.renewals[key]++
	r.mu.Unlock()
	if strings.Contains(key, r.lost) {
		return false, fmt.Errorf("renew claim %q: %w", key, store.ErrNotOwner)
	}
	return r.Idempotency.RenewClaim(ctx, key, owner, ttl)
}

func (r *renewStore) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.renewals[key]
}

func (r *renewStore) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.renewals {
		n += c
	}
	return n
}

// TestClaimRenewalSharedTicker: handlers in flight at once, on one interceptor, each
// outlive their pending TTL several times over. Every claim is renewed (a repeat meanwhile
// is Aborted, the claim still pending), each handler finishes and its result is stored; the
// one whose renewal finds another owner is cancelled at once, and only it. Once no handler
// runs, no renewal goes out.
func TestClaimRenewalSharedTicker(t *testing.T) {
	for _, c := range []struct {
		name string
		open func(t *testing.T) store.Idempotency
	}{
		{"bolt", func(t *testing.T) store.Idempotency { return openBolt(t) }},
		{"redis", func(t *testing.T) store.Idempotency { return openRedis(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			const ttl = 300 * time.Millisecond
			rs := &renewStore{Idempotency: c.open(t), lost: "job-lost", renewals: map[string]int{}}
			f := &fakeRunner{delay: 4 * ttl}
			cl := runnerClient(t, rs, f, idempotency.WithPendingTTL(ttl), idempotency.WithClaimRenewal(time.Minute),
				idempotency.WithRetryDelay(10*time.Millisecond))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			jobs := []string{"job-a", "job-b", "job-lost"}
			wait := deliverEach(ctx, cl, jobs)
			// Two ttls in: without renewals the kept claims would have lapsed.
			time.Sleep(2 * ttl)
			for _, job := range jobs[:2] {
				if _, err := deliver(ctx, cl, deliverReq(job)); status.Code(err) != codes.Aborted {
					t.Errorf("repeat of %s while it runs = %v; want Aborted (its claim renewed)", job, err)
				}
			}
			errs, took := wait()

			for i, job := range jobs[:2] {
				key, _ := deliverKey(deliverReq(job))
				if errs[i] != nil {
					t.Errorf("%s: %v; want its result", job, errs[i])
				}
				if st, _ := lookup(t, rs, key); st != store.Done {
					t.Errorf("%s: key state %v after the run; want Done", job, st)
				}
				if n := rs.count(key); n < 3 {
					t.Errorf("%s: %d renewals over %s with a %s ttl; want at least 3 (one per ttl/3)", job, n, took[i], ttl)
				}
			}
			if status.Code(errs[2]) == codes.OK {
				t.Errorf("job-lost: %v; want its handler cancelled (another owner holds the key)", errs[2])
			}
			if took[2] > 2*ttl {
				t.Errorf("job-lost took %s; want it cancelled at its first renewal (within %s)", took[2], ttl/3)
			}
			lostKey, _ := deliverKey(deliverReq("job-lost"))
			if n := rs.count(lostKey); n != 1 {
				t.Errorf("job-lost: %d renewals; want 1 (none after its claim was found lost)", n)
			}

			settled := rs.total()
			time.Sleep(ttl)
			if n := rs.total(); n != settled {
				t.Errorf("%d renewals after every handler returned; want none", n-settled)
			}
		})
	}
}
