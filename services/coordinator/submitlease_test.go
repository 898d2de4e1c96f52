package coordinator_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
)

// runLeaserStore is a bbolt store that creates a run with its lease (store.RunLeaser),
// counting those calls and CreateRun's, besides the ones a driver would otherwise take its
// lease and epoch with (fencerStore), and noting when its lease was first renewed.
// afterCreate, when set, runs after each CreateRunLeased.
type runLeaserStore struct {
	fencerStore
	leased, created atomic.Int32
	firstAcquire    atomic.Int64 // unix nanos of the first AcquireLease
	afterCreate     func()
}

func (r *runLeaserStore) CreateRunLeased(ctx context.Context, j *handoffv1.Job, l store.LeaseClaim, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, uint64, error) {
	r.leased.Add(1)
	run, created, epoch, err := r.Store.(store.RunLeaser).CreateRunLeased(ctx, j, l, evs...)
	if r.afterCreate != nil {
		r.afterCreate()
	}
	return run, created, epoch, err
}

func (r *runLeaserStore) CreateRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, error) {
	r.created.Add(1)
	return r.Store.CreateRun(ctx, j, evs...)
}

func (r *runLeaserStore) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	r.firstAcquire.CompareAndSwap(0, time.Now().UnixNano())
	return r.Store.AcquireLease(ctx, name, owner, ttl)
}

// leaseFree reports whether another owner can take lease name now. A lease it takes it
// releases at once: one left to lapse would be listed by the lapsed-lease watch, which
// would drive the run again.
func leaseFree(t *testing.T, st store.Store, name string) bool {
	t.Helper()
	ok, err := st.AcquireLease(context.Background(), name, "probe", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		if err := st.ReleaseLease(context.Background(), name, "probe"); err != nil {
			t.Fatal(err)
		}
	}
	return ok
}

// TestSubmitCreatesRunWithItsLease: on bbolt a submitted run is created with its lease and
// first epoch in one write, and its driver starts holding them: no other lease or fence
// call, the lease held (and renewed) while the draft is in flight for several ttls, the run
// completed under epoch 1, and the lease released when it ends.
func TestSubmitCreatesRunWithItsLease(t *testing.T) {
	r := startReplicas(t)
	bolt := r.st.Store
	if _, ok := bolt.(store.RunLeaser); !ok {
		t.Fatalf("the stack's bbolt store %T does not create runs with their lease", bolt)
	}
	ls := &runLeaserStore{fencerStore: fencerStore{Store: bolt}}
	a := r.replica(t, "replica-a", ls)
	t.Cleanup(r.g.release) // runs before the replicas' cleanups: a failure must not hold the draft till its stage timeout
	submitted := time.Now()
	id := r.submit(t, a, "tkt_leased")
	if l, c, f, e := ls.leased.Load(), ls.created.Load(), ls.combined.Load(), ls.fences.Load(); l != 1 || c != 0 || f != 0 || e != 0 {
		t.Fatalf("submit made %d CreateRunLeased, %d CreateRun, %d AcquireLeaseFence, %d FenceRun calls; want 1, 0, 0, 0", l, c, f, e)
	}
	testkit.Eventually(t, 10*time.Second, "the draft in flight", func() bool { return r.g.waits.Load() >= 1 })
	// The driver starts with the lease's time of taking (the write's start): no renewal
	// before its first hop. Its background renewals (keep) start LeaseTTL/3 after it does,
	// so a renewal sooner than that after the submit began is one made for the first hop.
	if first := ls.firstAcquire.Load(); first != 0 && time.Unix(0, first).Sub(submitted) < r.opts.LeaseTTL/3 {
		t.Fatalf("the driver renewed the lease %s after the submit began, before its first hop; want it to start from the lease taken with the run",
			time.Unix(0, first).Sub(submitted))
	}
	for range 4 { // two ttls: the driver renews the lease it was created with
		if leaseFree(t, bolt, "run:"+id) {
			t.Fatal("the run's lease was free while its draft was in flight")
		}
		time.Sleep(r.opts.LeaseTTL / 2)
	}
	r.g.release()
	if j := r.waitTerminal(t, []string{id}, 15*time.Second)[0]; j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || j.GetHops() != 3 {
		t.Fatalf("run ended %s after %d hops; want COMPLETED after 3", j.GetState(), j.GetHops())
	}
	for deadline := time.Now().Add(5 * time.Second); !leaseFree(t, bolt, "run:"+id); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the run's lease was not released when the run ended")
		}
	}
	if f, e := ls.combined.Load(), ls.fences.Load(); f != 0 || e != 0 {
		t.Fatalf("the driver made %d AcquireLeaseFence and %d FenceRun calls; want none (its epoch came with the run)", f, e)
	}
	if next, err := bolt.FenceRun(context.Background(), id); err != nil || next != 2 {
		t.Fatalf("FenceRun after the run = %d, %v; want 2 (the driver saved under 1)", next, err)
	}
}

// TestCloseDuringSubmitGivesLeaseBack: a coordinator closed between the write that created
// a run with its lease and the start of its driver starts none and gives the lease back at
// once, so another replica takes the run over on its first scan and completes it.
func TestCloseDuringSubmitGivesLeaseBack(t *testing.T) {
	r := startReplicas(t)
	r.g.release()
	ls := &runLeaserStore{fencerStore: fencerStore{Store: r.st.Store}}
	a := r.replica(t, "replica-a", ls)
	ls.afterCreate = a.Close
	id := r.submit(t, a, "tkt_closing")
	if !leaseFree(t, r.st.Store, "run:"+id) {
		t.Fatal("the new run's lease is still held after its coordinator closed during the submit")
	}
	if r.g.waits.Load() != 0 {
		t.Fatal("the closed coordinator sent the run's first hop")
	}
	r.replica(t, "replica-b", r.st.Store) // its first scan takes the run over
	if j := r.waitTerminal(t, []string{id}, 10*time.Second)[0]; j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("run ended %s under B, want COMPLETED", j.GetState())
	}
}
