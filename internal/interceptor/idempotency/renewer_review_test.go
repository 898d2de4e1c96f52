package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
)

// phaseStore passes the renewals of keys holding "anchor" to the real store and tells
// renewed of each; a key holding "victim" has its renewals fail at once while its claim is
// younger than ttl/2, and hang (until their context ends) after: a store that fails fast,
// then stalls.
type phaseStore struct {
	store.Idempotency
	ttl     time.Duration
	renewed chan time.Time

	mu      sync.Mutex
	claimed map[string]time.Time
}

func (p *phaseStore) Claim(ctx context.Context, key string, ttl time.Duration) (store.ClaimState, []byte, string, error) {
	p.mu.Lock()
	p.claimed[key] = time.Now()
	p.mu.Unlock()
	return p.Idempotency.Claim(ctx, key, ttl)
}

func (p *phaseStore) claimedAt(key string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claimed[key]
}

func (p *phaseStore) RenewClaim(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	switch {
	case strings.Contains(key, "anchor"):
		ok, err := p.Idempotency.RenewClaim(ctx, key, owner, ttl)
		select {
		case p.renewed <- time.Now():
		default:
		}
		return ok, err
	case strings.Contains(key, "victim"):
		if time.Since(p.claimedAt(key)) < p.ttl/2 {
			return false, errors.New("redis: connection reset by peer")
		}
		<-ctx.Done()
		return false, ctx.Err()
	}
	return p.Idempotency.RenewClaim(ctx, key, owner, ttl)
}

// TestFailingRenewalsCancelBeforeTheClaimLapses: a claim whose renewals fail, first at once
// and then by hanging, must have its handler cancelled before the claim lapses (pendingTTL
// after it was taken, with no renewal since): after that another caller can claim the key
// and two holders run at once. The claim here is taken just before a tick of the shared
// ticker (another handler in flight keeps it running), so its renewals come early in its
// life; the second fast failure is still under pendingTTL/2, and the third, hanging for its
// whole pendingTTL/3 bound, only returned (and cancelled the handler) past pendingTTL.
func TestFailingRenewalsCancelBeforeTheClaimLapses(t *testing.T) {
	const ttl = 1200 * time.Millisecond
	ps := &phaseStore{Idempotency: openBolt(t), ttl: ttl, renewed: make(chan time.Time, 1), claimed: map[string]time.Time{}}
	f := &fakeRunner{delay: 3 * ttl}
	cl := runnerClient(t, ps, f, idempotency.WithPendingTTL(ttl), idempotency.WithClaimRenewal(time.Minute),
		idempotency.WithRetryDelay(10*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	anchorDone := make(chan error, 1)
	go func() { _, err := deliver(ctx, cl, deliverReq("job-anchor")); anchorDone <- err }()
	var tick time.Time
	select {
	case tick = <-ps.renewed: // the shared ticker's first tick
	case <-ctx.Done():
		t.Fatal("the anchor's claim was never renewed")
	}
	// The next tick is ttl/3 after this one: claim the victim ttl/8 before it.
	time.Sleep(time.Until(tick.Add(ttl/3 - ttl/8)))
	_, err := deliver(ctx, cl, deliverReq("job-victim"))
	ended := time.Now()
	if err == nil {
		t.Fatal("victim: no error; want its handler cancelled (its renewals fail)")
	}
	key, _ := deliverKey(deliverReq("job-victim"))
	if held := ended.Sub(ps.claimedAt(key)); held >= ttl {
		t.Errorf("victim's handler ran %s after its claim, whose renewals all failed; want it cancelled before the claim lapses at %s", held, ttl)
	}
	if err := <-anchorDone; err != nil {
		t.Errorf("anchor: %v; want its result", err)
	}
}
