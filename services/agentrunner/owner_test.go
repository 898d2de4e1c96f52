package agentrunner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// pausedRunnerStore is the shared store as a runner paused by the OS sees it: from the pause
// on its claim renewals hang (until the test lets them go, failing), so the runner never
// learns in time that its claim lapsed; what its agent sends once woken (the Complete)
// goes through, and is counted.
type pausedRunnerStore struct {
	agentrunner.Store
	paused               atomic.Bool
	hang                 chan struct{}
	completes, notOwners atomic.Int32 // Completes sent after the pause, and those refused ErrNotOwner
}

func (p *pausedRunnerStore) RenewClaim(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if p.paused.Load() {
		<-p.hang
		return false, errors.New("paused: the renewal never left the process")
	}
	return p.Store.RenewClaim(ctx, key, owner, ttl)
}

func (p *pausedRunnerStore) Complete(ctx context.Context, key, owner string, v []byte, ttl time.Duration) error {
	err := p.Store.Complete(ctx, key, owner, v, ttl)
	if p.paused.Load() {
		p.completes.Add(1)
		if errors.Is(err, store.ErrNotOwner) {
			p.notOwners.Add(1)
		}
	}
	return err
}

// TestLapsedRunnerCompletionRefused: runner A's agent stalls past A's claim (A is paused: no
// renewal goes out), the claim lapses, and runner B (same store) claims the key and runs the
// stage. A wakes and its agent finishes: A's Complete names its own, lapsed claim and is
// refused (ErrNotOwner), so the key's record stays B's, written once; a re-delivery is
// answered with B's result. On bbolt, Redis and Redis Cluster.
func TestLapsedRunnerCompletionRefused(t *testing.T) {
	for _, c := range sharedStores(true) {
		t.Run(c.name, func(t *testing.T) {
			shared := c.open(t)
			const ttl = 300 * time.Millisecond
			working, wake, woke := make(chan struct{}), make(chan struct{}), make(chan struct{})
			stalled := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
				close(working)
				<-wake // stalled: deaf to its context until woken
				defer close(woke)
				return &handoffv1.StageResult{NextHint: "from A"}, nil
			}}
			fast := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(context.Context, agentrunner.Input) (*handoffv1.StageResult, error) {
				return &handoffv1.StageResult{NextHint: "from B"}, nil
			}}
			pa := &pausedRunnerStore{Store: shared, hang: make(chan struct{})}
			var once sync.Once
			unhang := func() { once.Do(func() { close(pa.hang) }) }
			t.Cleanup(unhang)
			a := start(t, agentrunner.Options{Store: pa, Agents: []agentrunner.Agent{stalled}, ClaimTTL: ttl, StageTimeout: time.Minute}, "")
			b := start(t, agentrunner.Options{Store: shared, Agents: []agentrunner.Agent{fast}, ClaimTTL: ttl, StageTimeout: time.Minute}, "")
			p := pkg("draft")
			key := agentrunner.CompletionKey(p.JobId, p.Stage, 0, 0)

			aDone := make(chan error, 1)
			go func() {
				_, err := deliver(t, a.client, &handoffv1.DeliverRequest{Package: p})
				aDone <- err
			}()
			<-working
			pa.paused.Store(true)
			var msgs []*handoffv1.DeliverResponse
			for attempt := 0; ; attempt++ { // the coordinator's retry, on B
				var err error
				if msgs, err = deliver(t, b.client, &handoffv1.DeliverRequest{Package: p}); err == nil {
					break
				}
				if status.Code(err) != codes.Aborted || attempt > 200 {
					t.Fatalf("retry %d on B = %v; want Aborted until A's claim lapses, then the stage", attempt, err)
				}
				time.Sleep(25 * time.Millisecond)
			}
			if len(msgs) != 2 || msgs[1].GetResult().GetNextHint() != "from B" {
				t.Fatalf("B's delivery = %v; want its own result", msgs)
			}
			close(wake)
			<-woke
			for deadline := time.Now().Add(5 * time.Second); pa.completes.Load() == 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			unhang() // A's delivery ends once its hung renewal returns
			aErr := <-aDone
			if pa.completes.Load() != 1 || pa.notOwners.Load() != 1 {
				t.Fatalf("A's late Completes: %d sent, %d refused ErrNotOwner; want its one refused (A's delivery ended %v)",
					pa.completes.Load(), pa.notOwners.Load(), aErr)
			}
			if status.Code(aErr) != codes.Aborted {
				t.Errorf("A's delivery ended %v; want Aborted (its claim lapsed, its result not stored)", aErr)
			}
			st, v, err := shared.Lookup(context.Background(), key)
			var prior handoffv1.PriorResult
			if err != nil || st != store.Done || proto.Unmarshal(v, &prior) != nil || prior.GetNextHint() != "from B" {
				t.Fatalf("record = %v %q %v; want done with B's result", st, prior.GetNextHint(), err)
			}
			again, err := deliver(t, b.client, &handoffv1.DeliverRequest{Package: p})
			if err != nil || len(again) != 1 || again[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE ||
				again[0].GetAck().GetPrior().GetNextHint() != "from B" {
				t.Fatalf("re-delivery = %v, %v; want DUPLICATE with B's result", again, err)
			}
			if fast.calls.Load() != 1 || stalled.calls.Load() != 1 {
				t.Errorf("agents ran A %d, B %d times; want 1 each", stalled.calls.Load(), fast.calls.Load())
			}
		})
	}
}
