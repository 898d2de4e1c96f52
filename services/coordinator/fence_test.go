package coordinator_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// landedSaves is a store that calls onSave with the run of every save that went through
// (PutRun and PutRunFenced), after the store took it.
type landedSaves struct {
	store.Store
	onSave func(*handoffv1.Job)
}

func (l *landedSaves) PutRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	err := l.Store.PutRun(ctx, j, evs...)
	if err == nil {
		l.onSave(j)
	}
	return err
}

func (l *landedSaves) PutRunFenced(ctx context.Context, j *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	err := l.Store.PutRunFenced(ctx, j, epoch, evs...)
	if err == nil {
		l.onSave(j)
	}
	return err
}

// historyStore records the hops of every save of a run that landed, in order.
type historyStore struct {
	landedSaves
	mu       sync.Mutex
	hops     []uint32
	advanced chan struct{} // closed at the first landed save with 2 hops or more
	once     sync.Once
	fences   atomic.Int32 // FenceRun calls: one per driver that took the run
}

func (h *historyStore) FenceRun(ctx context.Context, runID string) (uint64, error) {
	h.fences.Add(1)
	return h.Store.FenceRun(ctx, runID)
}

func (h *historyStore) landed(j *handoffv1.Job) {
	h.mu.Lock()
	h.hops = append(h.hops, j.GetHops())
	h.mu.Unlock()
	if j.GetHops() >= 2 {
		h.once.Do(func() { close(h.advanced) })
	}
}

// newHistoryStore is a historyStore over st.
func newHistoryStore(st store.Store) *historyStore {
	h := &historyStore{landedSaves: landedSaves{Store: st}, advanced: make(chan struct{})}
	h.onSave = h.landed
	return h
}

// pausedStore is the store as a replica paused by the OS sees it once paused: its lease
// renewals hang until the test ends, and its saves wait until the run has been advanced by
// another replica (then go through, as a process woken up would send them).
type pausedStore struct {
	*historyStore
	paused  atomic.Bool
	hang    chan struct{}
	refused atomic.Int32 // saves refused ErrFenced while paused
	landed  atomic.Int32 // saves that went through while paused
}

func (p *pausedStore) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if p.paused.Load() {
		<-p.hang
		return false, errCut
	}
	return p.historyStore.AcquireLease(ctx, name, owner, ttl)
}

func (p *pausedStore) save(put func() error) error {
	if !p.paused.Load() {
		return put()
	}
	<-p.advanced
	err := put()
	switch {
	case err == nil:
		p.landed.Add(1)
	case errors.Is(err, store.ErrFenced):
		p.refused.Add(1)
	}
	return err
}

func (p *pausedStore) PutRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	return p.save(func() error { return p.historyStore.PutRun(ctx, j, evs...) })
}

func (p *pausedStore) PutRunFenced(ctx context.Context, j *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	return p.save(func() error { return p.historyStore.PutRunFenced(ctx, j, epoch, evs...) })
}

// TestStaleDriverSaveRefused: replica A is paused with its judge hop in flight, past its
// lease; B takes the run over and advances it past the judge. A wakes and saves the state
// after its judge (a verdict is saved at once, not carried to the next package): that save
// is refused (the lease's fence), A stops, and the run's saved states never go back, ending
// COMPLETED under B.
func TestStaleDriverSaveRefused(t *testing.T) {
	r := startReplicasGated(t, "judge")
	h := newHistoryStore(r.st.Store)
	pa := &pausedStore{historyStore: h, hang: make(chan struct{})}
	a := r.replica(t, "replica-a", pa)
	t.Cleanup(func() { close(pa.hang); r.g.release() }) // before a's Close (cleanups run last first)
	id := r.submit(t, a, "tkt_fence")
	for r.g.waits.Load() < 1 { // A's judge is in flight
		time.Sleep(5 * time.Millisecond)
	}
	pa.paused.Store(true)
	r.replica(t, "replica-b", h)
	deadline := time.Now().Add(10 * time.Second)
	for h.fences.Load() < 2 { // B took the run over (A took it at submit)
		if time.Now().After(deadline) {
			t.Fatal("B did not take the run over")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.g.release()
	j := r.waitTerminal(t, []string{id}, 15*time.Second)[0]
	if j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || j.GetHops() != 3 {
		t.Errorf("run ended %s after %d hops; want COMPLETED after 3", j.GetState(), j.GetHops())
	}
	deadline = time.Now().Add(5 * time.Second)
	for pa.refused.Load()+pa.landed.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if pa.refused.Load() != 1 || pa.landed.Load() != 0 {
		t.Errorf("A's saves after its pause: %d refused, %d landed; want its one stale save refused", pa.refused.Load(), pa.landed.Load())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := 1; i < len(h.hops); i++ {
		if h.hops[i] < h.hops[i-1] {
			t.Fatalf("the run went back: saved hops in order %v", h.hops)
		}
	}
	if got := r.st.Store; got != nil {
		if j, err := got.GetRun(context.Background(), id); err != nil || j.GetHops() != 3 {
			t.Fatalf("run after A's stale save = %v, %v", j, err)
		}
	}
}

// TestResolveFencesStaleDriver: a person's decision holds the run as a driver does, with an
// epoch of its own: a driver that took the run before the decision and stalled (its epoch
// taken, the run read) cannot save over the decision afterwards, and the run stays as the
// decision left it.
func TestResolveFencesStaleDriver(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	ctx := context.Background()
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	before := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	stale, err := e.st.Store.FenceRun(ctx, job.GetRunId()) // a driver takes the run, reads it, stalls
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "bo", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "customer withdrew"}}}); err != nil {
		t.Fatal(err)
	}
	if err := e.st.Store.PutRunFenced(ctx, before, stale); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the stalled driver's save after the decision = %v; want ErrFenced", err)
	}
	if got, err := e.st.Store.GetRun(ctx, job.GetRunId()); err != nil || got.GetState() != handoffv1.JobState_JOB_STATE_FAILED {
		t.Fatalf("run after the stale save = %v, %v; want FAILED as the decision left it", got.GetState(), err)
	}
}

// fencerStore is a bbolt store that takes a lease and its epoch in one call
// (store.LeaseFencer), counting those calls and FenceRun's.
type fencerStore struct {
	store.Store
	combined, fences atomic.Int32
}

func (f *fencerStore) AcquireLeaseFence(ctx context.Context, name, owner string, ttl time.Duration, runID string) (bool, uint64, error) {
	f.combined.Add(1)
	return f.Store.(store.LeaseFencer).AcquireLeaseFence(ctx, name, owner, ttl, runID)
}

func (f *fencerStore) FenceRun(ctx context.Context, runID string) (uint64, error) {
	f.fences.Add(1)
	return f.Store.FenceRun(ctx, runID)
}

// TestSubmitFencesWithTheLease: on a store that takes a lease and its epoch at once, a
// submitted run's driver takes both in that one call and saves under that epoch (the run
// completes), and the epoch is the run's fence: a takeover's FenceRun goes past it, and a
// save under it is refused from then on.
func TestSubmitFencesWithTheLease(t *testing.T) {
	dir := t.TempDir()
	bolt, err := store.Open(filepath.Join(dir, "f.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	fs := &fencerStore{Store: bolt}
	judge := &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}
	st, client := startStack(t, stack.Config{DataDir: dir, Store: fs, Pipelines: relayPipeline(t, 10, 2), Agents: []agentrunner.Agent{&recorder{name: "draft"}, judge}})
	runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	evs, err := demo.Watch(context.Background(), client, runID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(evs); n == 0 || evs[n-1].GetKind() != handoffv1.EventKind_EVENT_KIND_COMPLETED {
		t.Fatalf("timeline %v; want it to end COMPLETED", kinds(evs))
	}
	if c, f := fs.combined.Load(), fs.fences.Load(); c != 1 || f != 0 {
		t.Fatalf("submit took %d lease-and-epoch calls and %d FenceRun calls; want 1 and 0", c, f)
	}
	ctx := context.Background()
	next, err := bolt.FenceRun(ctx, runID)
	if err != nil || next != 2 {
		t.Fatalf("FenceRun after the driver's epoch = %d, %v; want 2 (the driver saved under 1)", next, err)
	}
	j, err := bolt.GetRun(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if err := bolt.PutRunFenced(ctx, j, 1); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("save under the submit's epoch after a takeover = %v; want ErrFenced", err)
	}
}
