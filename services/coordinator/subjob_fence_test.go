package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// childSaves records every save of a nested run that landed, in order.
type childSaves struct {
	landedSaves
	mu       sync.Mutex
	saved    []*handoffv1.Job
	done     chan struct{} // closed at the first landed save of a nested run in a terminal state
	once     sync.Once
	fenceAts atomic.Int32 // FenceRunAt calls that went through: one per driver that took the nested run
}

func (c *childSaves) FenceRunAt(ctx context.Context, runID string, epoch uint64) error {
	err := c.Store.FenceRunAt(ctx, runID, epoch)
	if err == nil {
		c.fenceAts.Add(1)
	}
	return err
}

func (c *childSaves) landed(j *handoffv1.Job) {
	if j.GetParentRunId() == "" {
		return
	}
	c.mu.Lock()
	c.saved = append(c.saved, &handoffv1.Job{Hops: j.GetHops(), State: j.GetState(), Stage: j.GetStage()})
	c.mu.Unlock()
	if j.GetState() != handoffv1.JobState_JOB_STATE_RUNNING {
		c.once.Do(func() { close(c.done) })
	}
}

// newChildSaves is a childSaves over st.
func newChildSaves(st store.Store) *childSaves {
	c := &childSaves{landedSaves: landedSaves{Store: st}, done: make(chan struct{})}
	c.onSave = c.landed
	return c
}

// pausedDriver is the store as a replica paused by the OS sees it: once paused, its lease
// renewals hang until the test ends, and its saves wait until another replica has ended the
// nested run (then go through, as a process woken up would send them).
type pausedDriver struct {
	*childSaves
	paused         atomic.Bool
	hang           chan struct{}
	refused        atomic.Int32 // saves of the nested run refused ErrFenced while paused
	landedChild    atomic.Int32 // saves of the nested run that went through while paused
	refusedParent  atomic.Int32
	landedParent   atomic.Int32
	fenceAtRefused atomic.Int32
}

func (p *pausedDriver) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if p.paused.Load() {
		<-p.hang
		return false, errCut
	}
	return p.childSaves.AcquireLease(ctx, name, owner, ttl)
}

func (p *pausedDriver) FenceRunAt(ctx context.Context, runID string, epoch uint64) error {
	err := p.childSaves.FenceRunAt(ctx, runID, epoch)
	if errors.Is(err, store.ErrFenced) {
		p.fenceAtRefused.Add(1)
	}
	return err
}

func (p *pausedDriver) save(j *handoffv1.Job, put func() error) error {
	if !p.paused.Load() {
		return put()
	}
	<-p.done
	err := put()
	refused, landed := &p.refusedParent, &p.landedParent
	if j.GetParentRunId() != "" {
		refused, landed = &p.refused, &p.landedChild
	}
	switch {
	case err == nil:
		landed.Add(1)
	case errors.Is(err, store.ErrFenced):
		refused.Add(1)
	}
	return err
}

func (p *pausedDriver) PutRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	return p.save(j, func() error { return p.childSaves.PutRun(ctx, j, evs...) })
}

func (p *pausedDriver) PutRunFenced(ctx context.Context, j *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	return p.save(j, func() error { return p.childSaves.PutRunFenced(ctx, j, epoch, evs...) })
}

// TestSubJobStaleDriverSaveRefused: replica A drives a sub-job whose first hop (gather) is
// in flight when A is paused past its lease. Replica B takes the parent over, takes the
// nested run's fence (FenceRunAt, its epoch), and drives the nested run to its end. A wakes
// and saves the nested run as its gather hop left it: that save is refused (the nested run
// is fenced by B's epoch), A stops, and the nested run's saved states never go back. On
// bbolt, Redis and Redis Cluster (where the nested run's fence is in its own slot).
func TestSubJobStaleDriverSaveRefused(t *testing.T) {
	stores := []struct {
		name string
		open func(t *testing.T) store.Store
	}{
		{"bbolt", func(*testing.T) store.Store { return nil }},
		{"redis", func(t *testing.T) store.Store { return storetest.OpenRedis(t) }},
		{"cluster", func(t *testing.T) store.Store { return storetest.OpenCluster(t) }},
	}
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) { testSubJobStaleDriver(t, sc.open(t)) })
	}
}

func testSubJobStaleDriver(t *testing.T, s store.Store) {
	ctx := context.Background()
	pls := subPipelines(t, 5)
	g := newGate()
	gather, work := &router{name: "gather", out: "facts"}, &router{name: "work", out: "note"}
	judge := &router{name: "judge", verdict: handoffv1.Verdict_VERDICT_PASS}
	st, _ := startStack(t, stack.Config{Store: s, Pipelines: pls, Agents: []agentrunner.Agent{gatedAgent{gather, g}, work, &router{name: "polish", out: "note"}, judge}})
	t.Cleanup(g.release)
	st.Coordinator.Close()
	opts := replicaOptions(t, st, pls)
	h := newChildSaves(st.Store)
	pa := &pausedDriver{childSaves: h, hang: make(chan struct{})}
	a := startReplica(t, opts, "replica-a", pa)
	t.Cleanup(func() { close(pa.hang); g.release() }) // before a's Close (cleanups run last first)
	resp, err := a.SubmitJob(ctx, &handoffv1.SubmitJobRequest{JobId: "tkt_sf", RequestId: "tkt_sf", Pipeline: "outer", Goal: "g",
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, Inputs: []*handoffv1.Artifact{mustInput(t, st)}})
	if err != nil {
		t.Fatal(err)
	}
	runID := resp.GetJob().GetRunId()
	for deadline := time.Now().Add(15 * time.Second); g.waits.Load() < 1; { // A's gather is in flight
		if time.Now().After(deadline) {
			t.Fatal("the sub-job's gather hop never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.fenceAts.Load(); n != 1 {
		t.Fatalf("%d FenceRunAt of the nested run before the takeover; want A's one", n)
	}
	pa.paused.Store(true)
	startReplica(t, opts, "replica-b", h)
	for deadline := time.Now().Add(10 * time.Second); h.fenceAts.Load() < 2; { // B holds the nested run
		if time.Now().After(deadline) {
			t.Fatal("B did not take the nested run over")
		}
		time.Sleep(5 * time.Millisecond)
	}
	g.release() // A's gather answers; so does B's re-sent one (DUPLICATE)
	job := runEnded(t, st.Store, runID, func(job *handoffv1.Job) string { return fmt.Sprintf("after the takeover (stage %s)", job.GetStage()) })
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || len(job.GetChildren()) != 1 {
		t.Fatalf("state %s escalation %v children %v", job.GetState(), job.GetEscalation(), job.GetChildren())
	}
	for deadline := time.Now().Add(5 * time.Second); pa.refused.Load()+pa.landedChild.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if pa.refused.Load() != 1 || pa.landedChild.Load() != 0 || pa.landedParent.Load() != 0 {
		t.Errorf("A's saves after its pause: nested run %d refused, %d landed; parent %d landed; want its one stale save of the nested run refused, nothing landed",
			pa.refused.Load(), pa.landedChild.Load(), pa.landedParent.Load())
	}
	h.mu.Lock()
	saved := h.saved
	h.mu.Unlock()
	for i := 1; i < len(saved); i++ {
		if saved[i].GetHops() < saved[i-1].GetHops() || saved[i-1].GetState() != handoffv1.JobState_JOB_STATE_RUNNING {
			t.Fatalf("the nested run went back: its saves in order %v", saved)
		}
	}
	child, err := st.Store.GetRun(ctx, job.GetChildren()[0].GetRunId())
	if err != nil || child.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || child.GetHops() != 2 {
		t.Fatalf("nested run after A's stale save = %v, %v; want COMPLETED after 2 hops", child, err)
	}
	if gather.calls() != 1 || work.calls() != 1 {
		t.Errorf("gather ran %d times, work %d; want 1 each", gather.calls(), work.calls())
	}
	if es, err := st.Store.LedgerEntries(ctx); err != nil || len(es) != 1 {
		t.Errorf("ledger %d entries, %v; want 1 write", len(es), err)
	}
}

// TestNestedRunNotFencedOnItsOwn: a nested run is never taken as a run of its own, so its
// fence stays its parent driver's: neither the takeover scan (it is RUNNING) nor the lapsed
// lease of it (one an older release took) moves its fence past the parent driver's epoch,
// and that lease is given back.
func TestNestedRunNotFencedOnItsOwn(t *testing.T) {
	r := startReplicas(t)
	st, ctx := r.st.Store, context.Background()
	const child = "run_nested-sub-0"
	if _, _, err := st.CreateRun(ctx, &handoffv1.Job{RunId: child, ParentRunId: "run_nested", ParentStage: "sub", Pipeline: "relay",
		State: handoffv1.JobState_JOB_STATE_RUNNING, Stage: "draft"}); err != nil {
		t.Fatal(err)
	}
	if err := st.FenceRunAt(ctx, child, 3); err != nil { // its parent's driver holds epoch 3
		t.Fatal(err)
	}
	if ok, err := st.AcquireLease(ctx, leaseOf(child), "old-release", 300*time.Millisecond); err != nil || !ok {
		t.Fatalf("take the nested run's lease: %v %v", ok, err)
	}
	r.replica(t, "replica-b", st)
	time.Sleep(400 * time.Millisecond) // the lease lapses
	for deadline := time.Now().Add(5 * time.Second); ; {
		names, err := st.LapsedLeases(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(names, leaseOf(child)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the nested run's lapsed lease was never taken up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// No longer listed as lapsed: the replica holds the lease, then reads the run, finds it
	// nested and gives the lease back. Once it is back the replica is done with the run.
	testkit.Eventually(t, 5*time.Second, "the nested run's lease given back", func() bool {
		ok, err := st.AcquireLease(ctx, leaseOf(child), "probe", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	if err := st.PutRunFenced(ctx, &handoffv1.Job{RunId: child, ParentRunId: "run_nested", State: handoffv1.JobState_JOB_STATE_RUNNING, Hops: 1}, 3); err != nil {
		t.Fatalf("the parent driver's save of its nested run after the replica saw it = %v; want it still fenced by epoch 3", err)
	}
}

func leaseOf(runID string) string { return "run:" + runID }
