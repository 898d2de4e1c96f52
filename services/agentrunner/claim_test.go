package agentrunner_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// dyingStore is a runner's view of the shared store that can die with its runner: from
// kill on, nothing it sends reaches the store (a SIGKILLed process sends nothing more). It
// counts the claim renewals, the traffic a stage in flight costs.
type dyingStore struct {
	agentrunner.Store
	dead     atomic.Bool
	renewals atomic.Int64
}

var errDead = errors.New("this runner is dead")

func (d *dyingStore) RenewClaim(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if d.dead.Load() {
		return false, errDead
	}
	d.renewals.Add(1)
	return d.Store.RenewClaim(ctx, key, owner, ttl)
}

func (d *dyingStore) Complete(ctx context.Context, key, owner string, v []byte, ttl time.Duration) error {
	if d.dead.Load() {
		return errDead
	}
	return d.Store.Complete(ctx, key, owner, v, ttl)
}

func (d *dyingStore) Release(ctx context.Context, key, owner string) error {
	if d.dead.Load() {
		return errDead
	}
	return d.Store.Release(ctx, key, owner)
}

// TestRunnerDiesMidStage: runner A's agent works on a stage for many claim ttls, renewing
// its short claim, so runner B (same store) answers a re-delivery Aborted all along. Then A
// dies: its renewals stop, the claim lapses, and the coordinator's retry (Aborted until
// then) runs the stage on B. The figures (how soon after the kill B ran it, renewals per
// second of the stage in flight) are logged, not asserted.
func TestRunnerDiesMidStage(t *testing.T) {
	for _, c := range sharedStores(false) {
		t.Run(c.name, func(t *testing.T) {
			shared := c.open(t)
			const ttl = 600 * time.Millisecond
			working, stopped := make(chan struct{}), make(chan struct{})
			slow := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
				close(working)
				<-ctx.Done() // works until its claim is lost
				close(stopped)
				return nil, ctx.Err()
			}}
			fast := &fake{card: agentrunner.RoleCard{Name: "draft"}}
			dying := &dyingStore{Store: shared}
			a := start(t, agentrunner.Options{Store: dying, Agents: []agentrunner.Agent{slow}, ClaimTTL: ttl, StageTimeout: time.Minute}, "")
			b := start(t, agentrunner.Options{Store: shared, Agents: []agentrunner.Agent{fast}, ClaimTTL: ttl, StageTimeout: time.Minute}, "")
			p := pkg("draft")

			go func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if s, err := a.client.Deliver(ctx, &handoffv1.DeliverRequest{Package: p}); err == nil {
					for _, err := s.Recv(); err == nil; _, err = s.Recv() {
					}
				}
			}()
			<-working
			began := time.Now()
			for range 6 { // three ttls of a live stage: its claim holds
				time.Sleep(ttl / 2)
				if _, err := deliver(t, b.client, &handoffv1.DeliverRequest{Package: p}); status.Code(err) != codes.Aborted {
					t.Fatalf("re-delivery to B while A works = %v; want Aborted (A's renewed claim)", err)
				}
			}
			live := time.Since(began)
			t.Logf("claim renewals while the stage ran: %d in %s = %.2f store commands/s per stage in flight (ttl %s)",
				dying.renewals.Load(), live.Round(time.Millisecond), float64(dying.renewals.Load())/live.Seconds(), ttl)

			dying.dead.Store(true)
			a.stop()
			killed := time.Now()
			var msgs []*handoffv1.DeliverResponse
			for attempt := 0; ; attempt++ { // the coordinator's retry of an Aborted hop
				var err error
				msgs, err = deliver(t, b.client, &handoffv1.DeliverRequest{Package: p})
				if err == nil {
					break
				}
				if status.Code(err) != codes.Aborted || attempt > 200 {
					t.Fatalf("retry %d on B after A died = %v; want Aborted until the claim lapses, then the stage", attempt, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("the stage ran on B %s after A died", time.Since(killed).Round(time.Millisecond))
			if len(msgs) != 2 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED ||
				msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
				t.Fatalf("B's delivery = %v; want ACCEPTED and a COMPLETED result", msgs)
			}
			if fast.calls.Load() != 1 {
				t.Fatalf("B's agent ran %d times, want 1", fast.calls.Load())
			}
			// A, cut off, could not renew: its agent was told to stop (in a real kill it is
			// simply gone), so two agents never go on working on one stage.
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("A's agent was not cancelled after its claim could not be renewed")
			}
		})
	}
}

// sharedStore opens a store two runners share.
type sharedStore struct {
	name string
	open func(t *testing.T) agentrunner.Store
}

// sharedStores lists the stores two runners can share: one bbolt file, a Redis and, with
// cluster, the local Redis Cluster.
func sharedStores(cluster bool) []sharedStore {
	out := []sharedStore{
		{"bolt", func(t *testing.T) agentrunner.Store {
			st, err := store.Open(filepath.Join(t.TempDir(), "shared.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		}},
		{"redis", func(t *testing.T) agentrunner.Store { return storetest.OpenRedis(t) }},
	}
	if cluster {
		out = append(out, sharedStore{"cluster", func(t *testing.T) agentrunner.Store { return storetest.OpenCluster(t) }})
	}
	return out
}
