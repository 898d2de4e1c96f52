package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// RunLeases is the lease contract on two clients of the same data: a and b may be one store
// (bbolt: one process per file) or two connections to one server under one prefix (Redis:
// as two processes would have). Run calls it with one store as both. The subtests run in
// parallel on lease names of their own.
func RunLeases(t *testing.T, a, b store.Leases) {
	t.Run("Exclusive", func(t *testing.T) { t.Parallel(); testLeaseExclusive(t, a, b) })
	t.Run("ExpiryTakeover", func(t *testing.T) { t.Parallel(); testLeaseExpiry(t, a, b) })
	t.Run("Renew", func(t *testing.T) { t.Parallel(); testLeaseRenew(t, a, b) })
	t.Run("ReleaseOnlyByOwner", func(t *testing.T) { t.Parallel(); testLeaseRelease(t, a, b) })
	t.Run("Concurrent", func(t *testing.T) { t.Parallel(); testLeaseConcurrent(t, a, b) })
	t.Run("Arguments", func(t *testing.T) { t.Parallel(); testLeaseArguments(t, a) })
	t.Run("Lapsed", func(t *testing.T) { t.Parallel(); testLeaseLapsed(t, a, b) })
}

// testLeaseLapsed: a lease left to expire is listed by LapsedLeases (on either client) once
// its ttl has passed; a lease held and renewed, a released one and one taken over again are
// not.
func testLeaseLapsed(t *testing.T, a, b store.Leases) {
	dead, live, freed := leaseName(t, "dead"), leaseName(t, "live"), leaseName(t, "freed")
	// 600ms: room for the writes and the scan below to come before it passes on a loaded
	// machine.
	mustAcquire(t, a, dead, "owner-a", 600*time.Millisecond, true)
	mustAcquire(t, a, live, "owner-a", time.Minute, true)
	mustAcquire(t, a, freed, "owner-a", 600*time.Millisecond, true)
	mustRelease(t, a, freed, "owner-a")
	mine := func(l store.Leases) map[string]bool {
		t.Helper()
		names, err := l.LapsedLeases(context.Background(), 1000)
		if err != nil {
			t.Fatalf("LapsedLeases = %v", err)
		}
		out := map[string]bool{}
		for _, n := range names {
			if n == dead || n == live || n == freed {
				out[n] = true
			}
		}
		return out
	}
	if got := mine(b); len(got) != 0 {
		t.Fatalf("LapsedLeases before any ttl passed lists %v", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !mine(b)[dead] {
		if time.Now().After(deadline) {
			t.Fatalf("a lease left to expire is not listed as lapsed 10s after its 600ms ttl")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := mine(a); !got[dead] || got[live] || got[freed] {
		t.Fatalf("LapsedLeases lists %v; want only %s (not the held %s nor the released %s)", got, dead, live, freed)
	}
	mustAcquire(t, b, dead, "owner-b", time.Minute, true) // taken over: no longer lapsed
	if got := mine(a); len(got) != 0 {
		t.Fatalf("LapsedLeases after the takeover lists %v", got)
	}
	if _, err := a.LapsedLeases(context.Background(), 0); err != nil {
		t.Fatalf("LapsedLeases with no limit = %v", err)
	}
}

// leaseName is unique to the subtest, so the subtests can share one store.
func leaseName(t *testing.T, name string) string { return "run:" + t.Name() + ":" + name }

func mustAcquire(t *testing.T, l store.Leases, name, owner string, ttl time.Duration, want bool) {
	t.Helper()
	got, err := l.AcquireLease(context.Background(), name, owner, ttl)
	if err != nil {
		t.Fatalf("AcquireLease(%s, %s) = %v", name, owner, err)
	}
	if got != want {
		t.Fatalf("AcquireLease(%s, %s) = %v, want %v", name, owner, got, want)
	}
}

func mustRelease(t *testing.T, l store.Leases, name, owner string) {
	t.Helper()
	if err := l.ReleaseLease(context.Background(), name, owner); err != nil {
		t.Fatalf("ReleaseLease(%s, %s) = %v", name, owner, err)
	}
}

// testLeaseExclusive: a held lease is refused to every other owner, on either client, and
// leases of different names are independent.
func testLeaseExclusive(t *testing.T, a, b store.Leases) {
	n, other := leaseName(t, "1"), leaseName(t, "2")
	mustAcquire(t, a, n, "owner-a", time.Minute, true)
	mustAcquire(t, b, n, "owner-b", time.Minute, false)
	mustAcquire(t, a, n, "owner-c", time.Minute, false) // the client does not matter, the owner does
	mustAcquire(t, b, other, "owner-b", time.Minute, true)
	mustAcquire(t, a, other, "owner-a", time.Minute, false)
	// The holder renews from either client.
	mustAcquire(t, b, n, "owner-a", time.Minute, true)
}

// testLeaseExpiry: once a lease's ttl has passed without renewal another owner takes it, and
// the former holder can no longer renew it.
func testLeaseExpiry(t *testing.T, a, b store.Leases) {
	n := leaseName(t, "1")
	mustAcquire(t, a, n, "owner-a", 600*time.Millisecond, true)
	mustAcquire(t, b, n, "owner-b", time.Minute, false)
	time.Sleep(800 * time.Millisecond)
	mustAcquire(t, b, n, "owner-b", time.Minute, true)
	mustAcquire(t, a, n, "owner-a", time.Minute, false)
}

// testLeaseRenew: renewing gives the holder a new ttl from now, so a lease renewed in time
// outlives its first ttl; a holder may also take a free lease again after it expired.
func testLeaseRenew(t *testing.T, a, b store.Leases) {
	n := leaseName(t, "1")
	// Each step has 400–500ms of room for its write on a loaded machine.
	mustAcquire(t, a, n, "owner-a", time.Second, true)
	time.Sleep(500 * time.Millisecond)
	mustAcquire(t, a, n, "owner-a", time.Second, true)
	time.Sleep(600 * time.Millisecond) // 1.1s after the first acquire: past its ttl, not the renewal's
	mustAcquire(t, b, n, "owner-b", time.Minute, false)
	time.Sleep(600 * time.Millisecond) // now past the renewal's ttl too
	mustAcquire(t, a, n, "owner-a", time.Minute, true)
}

// testLeaseRelease: only the holder's release frees a lease; a release by anyone else, or of
// a free lease, changes nothing and is not an error.
func testLeaseRelease(t *testing.T, a, b store.Leases) {
	n := leaseName(t, "1")
	mustRelease(t, a, n, "owner-a") // free: nothing to do
	mustAcquire(t, a, n, "owner-a", time.Minute, true)
	mustRelease(t, b, n, "owner-b")
	mustAcquire(t, b, n, "owner-b", time.Minute, false)
	mustRelease(t, b, n, "owner-a") // the holder, from the other client
	mustAcquire(t, b, n, "owner-b", time.Minute, true)
	mustRelease(t, a, n, "owner-a") // the former holder cannot free it from its new owner
	mustAcquire(t, a, n, "owner-a", time.Minute, false)
}

// testLeaseConcurrent: owners racing for one free lease from both clients: exactly one wins.
func testLeaseConcurrent(t *testing.T, a, b store.Leases) {
	n := leaseName(t, "hot")
	clients := []store.Leases{a, b}
	var won atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := clients[i%2].AcquireLease(context.Background(), n, fmt.Sprintf("owner-%d", i), time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				won.Add(1)
			}
		}()
	}
	wg.Wait()
	if won.Load() != 1 {
		t.Fatalf("40 owners racing for one lease: %d won, want 1", won.Load())
	}
}

func testLeaseArguments(t *testing.T, l store.Leases) {
	ctx := context.Background()
	for _, c := range []struct {
		name, owner string
		ttl         time.Duration
	}{{"", "o", time.Second}, {"n", "", time.Second}, {"n", "o", 0}, {"n", "o", -time.Second}} {
		if ok, err := l.AcquireLease(ctx, c.name, c.owner, c.ttl); err == nil || ok {
			t.Errorf("AcquireLease(%q, %q, %s) = %v, %v; want an error", c.name, c.owner, c.ttl, ok, err)
		}
	}
	if err := l.ReleaseLease(ctx, "", "o"); err == nil {
		t.Error("ReleaseLease with no name succeeded")
	}
	if err := l.ReleaseLease(ctx, "n", ""); err == nil {
		t.Error("ReleaseLease with no owner succeeded")
	}
}

// testFence: a takeover's epoch refuses the saves of the epoch before it, leaving the run and
// its timeline as the newer holder saved them; the current epoch saves, with events.
func testFence(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "fenced", Hops: 0}); err != nil {
		t.Fatal(err)
	}
	old, err := s.FenceRun(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "fenced", Hops: 1}, old, &handoffv1.JobEvent{Stage: "a"}); err != nil {
		t.Fatalf("save under the current epoch %d: %v", old, err)
	}
	cur, err := s.FenceRun(ctx, "fenced") // another holder takes the run over
	if err != nil || cur <= old {
		t.Fatalf("FenceRun after %d = %d, %v; want a greater epoch", old, cur, err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "fenced", Hops: 2}, cur); err != nil {
		t.Fatalf("save under the new epoch %d: %v", cur, err)
	}
	err = s.PutRunFenced(ctx, &handoffv1.Job{RunId: "fenced", Hops: 1}, old, &handoffv1.JobEvent{Stage: "stale"})
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("stale save under epoch %d after %d = %v, want ErrFenced", old, cur, err)
	}
	if j, err := s.GetRun(ctx, "fenced"); err != nil || j.GetHops() != 2 {
		t.Fatalf("run after the refused stale save = %v, %v; want the newer holder's (hops 2)", j, err)
	}
	if evs, err := s.Events(ctx, "fenced", 0); err != nil || len(evs) != 1 {
		t.Fatalf("events after the refused stale save = %v, %v; want only the first save's", evs, err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "fenced", Hops: 3}, cur, &handoffv1.JobEvent{Stage: "b"}); err != nil {
		t.Fatal(err)
	}
	if evs, err := s.Events(ctx, "fenced", 0); err != nil || len(evs) != 2 || evs[1].GetSeq() != 2 {
		t.Fatalf("events = %v, %v; want 2", evs, err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "never"}, 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fenced save of a run never created = %v, want ErrNotFound", err)
	}
}

// testFenceAt: a nested run fenced by its parent's driver's epoch (FenceRunAt). The newer
// parent driver's epoch refuses the older's saves and its later FenceRunAt, the same epoch
// again is no error, and FenceRun still goes past a handed-down epoch.
func testFenceAt(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.FenceRunAt(ctx, "child", 3); err != nil { // before the run exists
		t.Fatalf("FenceRunAt(3) of a new run: %v", err)
	}
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "child", ParentRunId: "parent"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "child", Hops: 1}, 3, &handoffv1.JobEvent{Stage: "a"}); err != nil {
		t.Fatalf("save under the handed-down epoch 3: %v", err)
	}
	if err := s.FenceRunAt(ctx, "child", 3); err != nil {
		t.Fatalf("FenceRunAt(3) again (the same driver): %v", err)
	}
	if err := s.FenceRunAt(ctx, "child", 5); err != nil { // the parent's next driver
		t.Fatalf("FenceRunAt(5) after 3: %v", err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "child", Hops: 2}, 5); err != nil {
		t.Fatalf("save under epoch 5: %v", err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "child", Hops: 1}, 3, &handoffv1.JobEvent{Stage: "stale"}); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("stale save under epoch 3 after 5 = %v, want ErrFenced", err)
	}
	if err := s.FenceRunAt(ctx, "child", 4); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("FenceRunAt(4) after 5 = %v, want ErrFenced (an older parent driver cannot take the nested run back)", err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "child", Hops: 3}, 5, &handoffv1.JobEvent{Stage: "b"}); err != nil {
		t.Fatalf("save under epoch 5 after the refused FenceRunAt(4) (it changed nothing): %v", err)
	}
	if j, err := s.GetRun(ctx, "child"); err != nil || j.GetHops() != 3 {
		t.Fatalf("run = %v, %v; want hops 3", j, err)
	}
	if evs, err := s.Events(ctx, "child", 0); err != nil || len(evs) != 2 || evs[1].GetStage() != "b" {
		t.Fatalf("events = %v, %v; want a then b, nothing of the stale save", evs, err)
	}
	if e, err := s.FenceRun(ctx, "child"); err != nil || e <= 5 {
		t.Fatalf("FenceRun after FenceRunAt(5) = %d, %v; want past 5", e, err)
	}
	for _, c := range []struct {
		run   string
		epoch uint64
	}{{"", 1}, {"child", 0}} {
		if err := s.FenceRunAt(ctx, c.run, c.epoch); err == nil || errors.Is(err, store.ErrFenced) {
			t.Errorf("FenceRunAt(%q, %d) = %v; want an argument error", c.run, c.epoch, err)
		}
	}
}

// testLeaseFence: AcquireLeaseFence (on a store that has it) takes the lease and the run's
// next epoch, which refuses saves under the epoch before; it renews a lease the owner holds
// with a new epoch again, and while another owner holds the lease it takes neither.
func testLeaseFence(t *testing.T, s store.Store) {
	lf, ok := s.(store.LeaseFencer)
	if !ok {
		t.Skip("the store takes leases and fences in two calls")
	}
	ctx := context.Background()
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "lf"}); err != nil {
		t.Fatal(err)
	}
	before, err := s.FenceRun(ctx, "lf")
	if err != nil {
		t.Fatal(err)
	}
	held, epoch, err := lf.AcquireLeaseFence(ctx, "run:lf", "owner-a", time.Minute, "lf")
	if err != nil || !held || epoch != before+1 {
		t.Fatalf("AcquireLeaseFence of a free lease = %v, %d, %v; want held at epoch %d", held, epoch, err, before+1)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "lf", Hops: 1}, before); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("save under the epoch before = %v, want ErrFenced", err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "lf", Hops: 1}, epoch); err != nil {
		t.Fatalf("save under the new epoch: %v", err)
	}
	if ok, err := s.AcquireLease(ctx, "run:lf", "owner-b", time.Minute); err != nil || ok {
		t.Fatalf("another owner's AcquireLease after AcquireLeaseFence = %v, %v; want refused (the lease is held)", ok, err)
	}
	held, again, err := lf.AcquireLeaseFence(ctx, "run:lf", "owner-a", time.Minute, "lf")
	if err != nil || !held || again != epoch+1 {
		t.Fatalf("AcquireLeaseFence by the holder = %v, %d, %v; want held at epoch %d", held, again, err, epoch+1)
	}
	held, other, err := lf.AcquireLeaseFence(ctx, "run:lf", "owner-b", time.Minute, "lf")
	if err != nil || held || other != 0 {
		t.Fatalf("AcquireLeaseFence while another owner holds the lease = %v, %d, %v; want neither lease nor epoch", held, other, err)
	}
	if err := s.PutRunFenced(ctx, &handoffv1.Job{RunId: "lf", Hops: 2}, again); err != nil {
		t.Fatalf("save under the holder's epoch after a refused AcquireLeaseFence (it changed nothing): %v", err)
	}
	if _, _, err := lf.AcquireLeaseFence(ctx, "run:lf", "owner-a", time.Minute, ""); err == nil {
		t.Error("AcquireLeaseFence with no run id succeeded")
	}
	if _, _, err := lf.AcquireLeaseFence(ctx, "", "owner-a", time.Minute, "lf"); err == nil {
		t.Error("AcquireLeaseFence with no lease name succeeded")
	}
}

// CreateRunLeased: CreateRunLeased (on a store that has it) creates the run as CreateRun
// does, holding its lease at its first epoch; the request's earlier run again takes no
// lease; bad lease arguments and a job conflict write nothing and take no lease; a lease
// another owner holds is left to it, and the run is created all the same.
//
// Only some stores have it, so it is not part of Run: their tests call it.
func CreateRunLeased(t *testing.T, s store.Store) {
	rl, ok := s.(store.RunLeaser)
	if !ok {
		t.Fatalf("%T does not create runs with their lease (store.RunLeaser)", s)
	}
	ctx := context.Background()
	claim := func(runID string) store.LeaseClaim {
		return store.LeaseClaim{Name: "run:" + runID, Owner: "owner-a", TTL: time.Minute}
	}
	free := func(runID string) {
		t.Helper()
		mustAcquire(t, s, "run:"+runID, "owner-b", time.Minute, true) // free: no lease taken
		if e, err := s.FenceRun(ctx, runID); err != nil || e != 1 {
			t.Fatalf("FenceRun(%s) = %d, %v; want 1 (no epoch taken)", runID, e, err)
		}
	}

	ev := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED}
	run, created, epoch, err := rl.CreateRunLeased(ctx, submitted("rl-1", "rl-req"), claim("rl-1"), ev)
	if err != nil || !created || epoch != 1 || run.GetRunId() != "rl-1" {
		t.Fatalf("CreateRunLeased of a new run = %v, %v, %d, %v; want rl-1 created at epoch 1", run.GetRunId(), created, epoch, err)
	}
	if ev.GetSeq() != 1 {
		t.Fatalf("the event's seq = %d; want 1", ev.GetSeq())
	}
	if w, err := s.Wallet(ctx, "rl-1"); err != nil || w.GetHopsRemaining() != 9 {
		t.Fatalf("the run's wallet = %v, %v; want 9 hops (opened with the run)", w, err)
	}
	mustAcquire(t, s, "run:rl-1", "owner-b", time.Minute, false) // owner-a holds it
	for _, stale := range []uint64{0, 2} {
		if err := s.PutRunFenced(ctx, submitted("rl-1", "rl-req"), stale); !errors.Is(err, store.ErrFenced) {
			t.Fatalf("save under epoch %d of a run created at epoch 1 = %v, want ErrFenced", stale, err)
		}
	}
	if err := s.PutRunFenced(ctx, submitted("rl-1", "rl-req"), 1, &handoffv1.JobEvent{Stage: "a"}); err != nil {
		t.Fatalf("save under the run's epoch 1: %v", err)
	}

	// The same request again: the earlier run, nothing written, no lease taken.
	run, created, epoch, err = rl.CreateRunLeased(ctx, submitted("rl-2", "rl-req"), claim("rl-2"))
	if err != nil || created || epoch != 0 || run.GetRunId() != "rl-1" {
		t.Fatalf("CreateRunLeased of the same request again = %v, %v, %d, %v; want rl-1, not created, epoch 0", run.GetRunId(), created, epoch, err)
	}
	free("rl-2")
	if err := s.PutRunFenced(ctx, submitted("rl-1", "rl-req"), 1); err != nil {
		t.Fatalf("save under epoch 1 after the request again (its fence untouched): %v", err)
	}

	for _, c := range []struct {
		field string
		lease store.LeaseClaim
	}{
		{"lease name", store.LeaseClaim{Owner: "owner-a", TTL: time.Minute}},
		{"lease owner", store.LeaseClaim{Name: "run:rl-bad", TTL: time.Minute}},
		{"lease ttl", store.LeaseClaim{Name: "run:rl-bad", Owner: "owner-a"}},
		{"lease ttl", store.LeaseClaim{Name: "run:rl-bad", Owner: "owner-a", TTL: -time.Second}},
	} {
		_, created, epoch, err := rl.CreateRunLeased(ctx, submitted("rl-bad", "rl-bad-req"), c.lease)
		if err == nil || !strings.Contains(err.Error(), c.field) || created || epoch != 0 {
			t.Fatalf("CreateRunLeased with %+v = %v, %d, %v; want an error naming the %s", c.lease, created, epoch, err, c.field)
		}
		if _, err := s.GetRun(ctx, "rl-bad"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("CreateRunLeased with %+v stored its run: %v", c.lease, err)
		}
	}
	free("rl-bad")

	conflict := submitted("rl-x", "")
	conflict.Goal = "refund the customer"
	if _, created, epoch, err := rl.CreateRunLeased(ctx, conflict, claim("rl-x")); !errors.Is(err, store.ErrJobConflict) || created || epoch != 0 {
		t.Fatalf("CreateRunLeased of job_id again with another goal = %v, %d, %v; want ErrJobConflict", created, epoch, err)
	}
	if _, err := s.GetRun(ctx, "rl-x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused run was stored: %v", err)
	}
	free("rl-x")

	// A lease another owner holds: the run is created, the lease and the fence left alone.
	mustAcquire(t, s, "run:rl-h", "owner-b", time.Minute, true)
	if _, created, epoch, err := rl.CreateRunLeased(ctx, submitted("rl-h", ""), claim("rl-h")); err != nil || !created || epoch != 0 {
		t.Fatalf("CreateRunLeased while another owner holds the lease = %v, %d, %v; want created, epoch 0", created, epoch, err)
	}
	mustAcquire(t, s, "run:rl-h", "owner-a", time.Minute, false) // still owner-b's
	if e, err := s.FenceRun(ctx, "rl-h"); err != nil || e != 1 {
		t.Fatalf("FenceRun(rl-h) = %d, %v; want 1 (no epoch taken)", e, err)
	}
}
