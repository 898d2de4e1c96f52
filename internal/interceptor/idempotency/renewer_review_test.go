package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
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

// mixRunner is a runner whose long jobs ("long-" ids) run for long, on their context, and
// whose other jobs answer at once.
type mixRunner struct {
	fakeRunner
	long time.Duration
}

func (m *mixRunner) Deliver(req *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	f := &m.fakeRunner
	if !strings.HasPrefix(req.GetPackage().GetJobId(), "long-") {
		return f.Deliver(req, stream)
	}
	p := req.GetPackage()
	ack := contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	if err := stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}); err != nil {
		return err
	}
	select {
	case <-time.After(m.long):
	case <-stream.Context().Done():
		return status.FromContextError(stream.Context().Err()).Err()
	}
	res := &handoffv1.StageResult{JobId: p.GetJobId(), Stage: p.GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED, NextHint: "long"}
	return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: res}})
}

// TestClaimRenewalStress: many short and long handlers at once, in waves, on one
// interceptor (run it with -race). Every long one outlives its TTL several times and is
// renewed at least once per TTL/3 of its run and then completes; the short ones, joining
// and leaving the set between and across ticks, complete; once every handler has returned
// no renewal goes out, and the ticker's goroutine and every renewal's are gone.
func TestClaimRenewalStress(t *testing.T) {
	const ttl = 300 * time.Millisecond
	rs := &renewStore{Idempotency: openBolt(t), lost: "\x00never", renewals: map[string]int{}}
	r := &mixRunner{long: 4 * ttl}
	conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(s, r) }, nil,
		[]grpc.StreamServerInterceptor{idempotency.StreamServerInterceptor(rs, deliverOpts(idempotency.WithPendingTTL(ttl),
			idempotency.WithClaimRenewal(time.Minute), idempotency.WithRetryDelay(10*time.Millisecond))...)})
	cl := handoffv1.NewAgentRunnerServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A first call brings the connection up; the ticker then stops at its first empty tick.
	if _, err := deliver(ctx, cl, deliverReq("warm")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl)
	base := runtime.NumGoroutine()

	const waves, longs, shorts = 3, 6, 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	took := map[string]time.Duration{}
	call := func(job string) {
		defer wg.Done()
		start := time.Now()
		_, err := deliver(ctx, cl, deliverReq(job))
		mu.Lock()
		defer mu.Unlock()
		took[job] = time.Since(start)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", job, err))
		}
	}
	for w := range waves {
		for i := range longs {
			wg.Add(1)
			go call(fmt.Sprintf("long-%d-%d", w, i))
		}
		for i := range shorts {
			wg.Add(1)
			go call(fmt.Sprintf("short-%d-%d", w, i))
			if i%10 == 0 {
				time.Sleep(ttl / 7) // spread them over the ticks
			}
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	for job, d := range took {
		key, _ := deliverKey(deliverReq(job))
		if st, _ := lookup(t, rs, key); st != store.Done {
			t.Errorf("%s: key state %v; want Done", job, st)
		}
		if strings.HasPrefix(job, "long-") {
			// Two short of one per ttl/3: on a loaded machine the shared ticker drops a tick
			// for a late receiver now and then (seen: 10 of 12 in 1.2 s), and a renewal at
			// ttl/2 or slower is still caught.
			if n, want := rs.count(key), int(d/(ttl/3))-2; n < want {
				t.Errorf("%s: %d renewals in %s; want at least %d (one per ttl/3, less two)", job, n, d, want)
			}
		}
	}
	settled := rs.total()
	testkit.Eventually(t, 10*time.Second, "the renewer's goroutines to end", func() bool {
		return runtime.NumGoroutine() <= base
	})
	if n := rs.total(); n != settled {
		t.Errorf("%d renewals after every handler returned; want none", n-settled)
	}
}

// hangStore hangs every renewal of a key holding "hang" until its context ends, and counts
// every key's renewals.
type hangStore struct {
	*renewStore
}

func (h hangStore) RenewClaim(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if strings.Contains(key, "hang") {
		h.mu.Lock()
		h.renewals[key]++
		h.mu.Unlock()
		<-ctx.Done()
		return false, ctx.Err()
	}
	return h.renewStore.RenewClaim(ctx, key, owner, ttl)
}

// TestHungRenewalDelaysNoOther: while one claim's renewals hang, the other claims on the
// same shared ticker are renewed on time (once per TTL/3) and their handlers finish, and
// the hung one's handler is cancelled before its claim lapses.
func TestHungRenewalDelaysNoOther(t *testing.T) {
	const ttl = 600 * time.Millisecond
	hs := hangStore{&renewStore{Idempotency: openBolt(t), lost: "\x00never", renewals: map[string]int{}}}
	r := &mixRunner{long: 3 * ttl}
	conn := serve(t, func(s *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(s, r) }, nil,
		[]grpc.StreamServerInterceptor{idempotency.StreamServerInterceptor(hs, deliverOpts(idempotency.WithPendingTTL(ttl),
			idempotency.WithClaimRenewal(time.Minute), idempotency.WithRetryDelay(10*time.Millisecond))...)})
	cl := handoffv1.NewAgentRunnerServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	jobs := []string{"long-hang", "long-a", "long-b"}
	errs, took := deliverEach(ctx, cl, jobs)()
	if errs[0] == nil {
		t.Error("long-hang: no error; want its handler cancelled (its renewals hang)")
	}
	if took[0] >= ttl {
		t.Errorf("long-hang took %s; want it cancelled before its claim lapses at %s", took[0], ttl)
	}
	for i, job := range jobs[1:] {
		key, _ := deliverKey(deliverReq(job))
		if errs[i+1] != nil {
			t.Errorf("%s: %v; want its result", job, errs[i+1])
		}
		if n, want := hs.count(key), int(took[i+1]/(ttl/3))-1; n < want {
			t.Errorf("%s: %d renewals in %s beside a hung one; want at least %d", job, n, took[i+1], want)
		}
	}
}
