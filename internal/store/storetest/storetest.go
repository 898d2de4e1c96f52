// Package storetest is the contract test suite every store.Store implementation must pass.
// Each implementation's own test calls Run with a constructor for a fresh, empty store.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// Run runs the suite. newStore must return an empty store that the suite may use freely.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("Runs", func(t *testing.T) { testRuns(t, newStore(t)) })
	t.Run("SubmitRules", func(t *testing.T) { testSubmitRules(t, newStore(t)) })
	t.Run("ListRunsPaging", func(t *testing.T) { testListRuns(t, newStore(t)) })
	t.Run("Events", func(t *testing.T) { testEvents(t, newStore(t)) })
	t.Run("EventsWhole", func(t *testing.T) { testEventsWhole(t, newStore(t)) })
	t.Run("ClaimCompleteRelease", func(t *testing.T) { testClaim(t, newStore(t)) })
	t.Run("ClaimExpiry", func(t *testing.T) { testClaimExpiry(t, newStore(t)) })
	t.Run("RenewClaim", func(t *testing.T) { testRenewClaim(t, newStore(t)) })
	t.Run("ClaimOwner", func(t *testing.T) { testClaimOwner(t, newStore(t)) })
	t.Run("ConcurrentClaim", func(t *testing.T) { testConcurrentClaim(t, newStore(t)) })
	t.Run("Ledger", func(t *testing.T) { runLedger(t, newStore) })
	t.Run("Wallet", func(t *testing.T) { testWallet(t, newStore(t)) })
	t.Run("WalletJob", func(t *testing.T) { testWalletJob(t, newStore(t)) })
	t.Run("ConcurrentDebit", func(t *testing.T) { testConcurrentDebit(t, newStore(t)) })
	t.Run("Grant", func(t *testing.T) { testGrant(t, newStore(t)) })
	t.Run("WalletExactMoney", func(t *testing.T) { testWalletExactMoney(t, newStore(t)) })
	t.Run("RunEdges", func(t *testing.T) { testRunEdges(t, newStore(t)) })
	t.Run("ListRunsFilteredPaging", func(t *testing.T) { testListRunsFiltered(t, newStore(t)) })
	t.Run("IdempotencyEdges", func(t *testing.T) { testIdempotencyEdges(t, newStore(t)) })
	t.Run("Admit", func(t *testing.T) { testAdmit(t, newStore(t)) })
	t.Run("ConcurrentAdmit", func(t *testing.T) { testConcurrentAdmit(t, newStore(t)) })
	t.Run("Verdicts", func(t *testing.T) { testVerdicts(t, newStore(t)) })
	t.Run("Leases", func(t *testing.T) { s := newStore(t); RunLeases(t, s, s) })
	t.Run("Fence", func(t *testing.T) { testFence(t, newStore(t)) })
	t.Run("FenceAt", func(t *testing.T) { testFenceAt(t, newStore(t)) })
	t.Run("LeaseFence", func(t *testing.T) { testLeaseFence(t, newStore(t)) })
}

// testGrant: a grant adds to the wallet once per key, never past a budget's caps, and
// only to a wallet that exists.
func testGrant(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.OpenWallet(ctx, "w", "job-w", &handoffv1.Budget{UsdRemainingMicros: 5, HopsRemaining: 0, RevisionsRemaining: 1}); err != nil {
		t.Fatal(err)
	}
	g := store.Grant{Hops: 4, Revisions: 2, USDMicros: 1_000_001}
	for i := range 2 {
		got, err := s.GrantWallet(ctx, "w", "run_1/2", g)
		if err != nil || got.GetHopsRemaining() != 4 || got.GetRevisionsRemaining() != 3 || got.GetUsdRemainingMicros() != 1_000_006 {
			t.Fatalf("grant %d = %v, %v; want 4 hops, 3 revisions, 1000006 micros (once per key)", i+1, got, err)
		}
	}
	got, err := s.GrantWallet(ctx, "w", "run_1/3", store.Grant{Hops: 1})
	if err != nil || got.GetHopsRemaining() != 5 {
		t.Fatalf("second key: %v %v; want 5 hops", got, err)
	}
	if _, err := s.GrantWallet(ctx, "w", "big", store.Grant{Hops: store.MaxHops}); !errors.Is(err, store.ErrGrantTooLarge) {
		t.Fatalf("grant past the hop cap: %v, want ErrGrantTooLarge", err)
	}
	if _, err := s.GrantWallet(ctx, "w", "rich", store.Grant{USDMicros: math.MaxInt64}); !errors.Is(err, store.ErrGrantTooLarge) {
		t.Fatalf("grant overflowing money: %v, want ErrGrantTooLarge", err)
	}
	if got, err := s.Wallet(ctx, "w"); err != nil || got.GetHopsRemaining() != 5 || got.GetUsdRemainingMicros() != 1_000_006 {
		t.Fatalf("after refused grants: %v %v; want them to change nothing", got, err)
	}
	if _, err := s.GrantWallet(ctx, "nope", "k", g); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("grant to no wallet: %v, want ErrNotFound", err)
	}
}

// testWalletExactMoney: money is an exact int64 all the way up (no float rounding), and a
// debit that would add money is refused without taking anything.
func testWalletExactMoney(t *testing.T, s store.Store) {
	ctx := context.Background()
	const big = 1<<62 + 1 // far past 2^53, where a float64 stops being exact
	if _, err := s.OpenWallet(ctx, "rich", "job-rich", &handoffv1.Budget{UsdRemainingMicros: big, HopsRemaining: 3, RevisionsRemaining: 2}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Debit(ctx, "rich", store.Debit{USDMicros: 1, RequireMoney: true})
	if err != nil || got.GetUsdRemainingMicros() != big-1 {
		t.Fatalf("Debit 1 from %d = %v, %v; want %d", int64(big), got, err, int64(big-1))
	}
	got, err = s.Debit(ctx, "rich", store.Debit{Hops: 1, Revisions: 1, USDMicros: big - 3})
	if err != nil || got.GetUsdRemainingMicros() != 2 || got.GetHopsRemaining() != 2 || got.GetRevisionsRemaining() != 1 {
		t.Fatalf("Debit %d = %v, %v; want 2 left, 2 hops, 1 revision", int64(big-3), got, err)
	}
	if _, err := s.Debit(ctx, "rich", store.Debit{USDMicros: -5}); err == nil || errors.Is(err, store.ErrWalletEmpty) {
		t.Fatalf("negative Debit = %v; want an error other than ErrWalletEmpty", err)
	}
	// Exactly what is left: ends at zero; then a zero debit without RequireMoney succeeds.
	if got, err = s.Debit(ctx, "rich", store.Debit{USDMicros: 2}); err != nil || got.GetUsdRemainingMicros() != 0 {
		t.Fatalf("Debit of exactly what is left = %v, %v; want 0", got, err)
	}
	if got, err = s.Debit(ctx, "rich", store.Debit{}); err != nil || got.GetHopsRemaining() != 2 {
		t.Fatalf("empty Debit = %v, %v; want the wallet unchanged", got, err)
	}
	if _, err := s.Wallet(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Wallet(missing) = %v, want ErrNotFound", err)
	}
	// Admit's debit is as exact, and reports what is left after it.
	if _, err := s.OpenWallet(ctx, "rich2", "job-rich2", &handoffv1.Budget{UsdRemainingMicros: big, HopsRemaining: 3, RevisionsRemaining: 2}); err != nil {
		t.Fatal(err)
	}
	a, err := s.Admit(ctx, "rich2-k", time.Minute, "rich2", store.Debit{Hops: 2, Revisions: 1, USDMicros: 3, RequireMoney: true, Job: "job-rich2"})
	want := &handoffv1.Budget{UsdRemainingMicros: big - 3, HopsRemaining: 1, RevisionsRemaining: 1}
	if err != nil || !a.Debited || !proto.Equal(a.Wallet, want) {
		t.Fatalf("Admit debiting 3 from %d = %+v, %v; want %v", int64(big), a, err, want)
	}
	if w, err := s.Wallet(ctx, "rich2"); err != nil || !proto.Equal(w, want) {
		t.Fatalf("wallet after Admit = %v, %v; want %v", w, err, want)
	}
	a, err = s.Admit(ctx, "rich2-k2", time.Minute, "rich2", store.Debit{Hops: 1, USDMicros: big, Job: "job-rich2"})
	want = &handoffv1.Budget{HopsRemaining: 0, RevisionsRemaining: 1}
	if err != nil || !a.Debited || !proto.Equal(a.Wallet, want) {
		t.Fatalf("Admit debiting more money than is left = %+v, %v; want %v (money clamped at zero)", a, err, want)
	}
}

// testRunEdges: a taken run id is refused (and not listed twice), a caller's seq is ignored,
// and Events tells a run with no events from a missing run.
func testRunEdges(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{}); err == nil {
		t.Fatal("CreateRun with no run_id succeeded")
	}
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "dup", Goal: "first"}); err != nil {
		t.Fatal(err)
	}
	if _, created, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "dup", Goal: "second"}); err == nil || created {
		t.Fatalf("CreateRun of a taken run id = %v, %v; want an error", created, err)
	}
	if got, err := s.GetRun(ctx, "dup"); err != nil || got.GetGoal() != "first" {
		t.Fatalf("GetRun(dup) = %v, %v; want the first run untouched", got, err)
	}
	if runs, next, err := s.ListRuns(ctx, 0, 10, ""); err != nil || len(runs) != 1 || next != "" {
		t.Fatalf("ListRuns = %v, %q, %v; want the one run once", runs, next, err)
	}
	if evs, err := s.Events(ctx, "dup", 0); err != nil || len(evs) != 0 {
		t.Fatalf("Events(run with none) = %v, %v; want none, no error", evs, err)
	}
	if _, err := s.Events(ctx, "missing", 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Events(missing run) = %v, want ErrNotFound", err)
	}
	if seq, err := s.AppendEvent(ctx, "dup", &handoffv1.JobEvent{Seq: 42, Stage: "a"}); err != nil || seq != 1 {
		t.Fatalf("AppendEvent with a caller-set seq = %d, %v; want 1", seq, err)
	}
	evs, err := s.Events(ctx, "dup", 0)
	if err != nil || len(evs) != 1 || evs[0].GetSeq() != 1 || evs[0].GetStage() != "a" {
		t.Fatalf("Events = %v, %v; want the one event with seq 1", evs, err)
	}
	if evs, err := s.Events(ctx, "dup", 1); err != nil || len(evs) != 0 {
		t.Fatalf("Events(after the last) = %v, %v; want none", evs, err)
	}
}

// testListRunsFiltered: page tokens walk a state-filtered listing one match at a time.
func testListRunsFiltered(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := 1; i <= 7; i++ {
		st := handoffv1.JobState_JOB_STATE_COMPLETED
		if i%3 == 0 {
			st = handoffv1.JobState_JOB_STATE_ESCALATED
		}
		if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: fmt.Sprintf("run-%d", i), State: st}); err != nil {
			t.Fatal(err)
		}
	}
	ids := PagedRunIDs(t, s, handoffv1.JobState_JOB_STATE_ESCALATED, 1, 10)
	if fmt.Sprint(ids) != "[run-6 run-3]" {
		t.Fatalf("filtered paging = %v, want [run-6 run-3]", ids)
	}
	if _, _, err := s.ListRuns(ctx, 0, 1, "not-a-token"); err == nil {
		t.Fatal("ListRuns with a bad page token succeeded")
	}
}

// testIdempotencyEdges: values are stored byte for byte, a done record without ttl outlives
// the pending marker's ttl, and a claim with no ttl does not expire.
func testIdempotencyEdges(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, _, _, err := s.Claim(ctx, "", time.Minute); err == nil {
		t.Fatal("Claim of an empty key succeeded")
	}
	bin := []byte{'P', 0, 0xff, 'D', '\n'}
	st, _, binOwner, _ := s.Claim(ctx, "bin", 50*time.Millisecond)
	if st != store.Claimed || binOwner == "" {
		t.Fatalf("claim = %v, owner %q", st, binOwner)
	}
	if err := s.Complete(ctx, "bin", binOwner, bin, 0); err != nil {
		t.Fatal(err)
	}
	st, _, foreverOwner, _ := s.Claim(ctx, "forever", 0)
	if st != store.Claimed {
		t.Fatalf("claim without ttl = %v", st)
	}
	time.Sleep(120 * time.Millisecond)
	if st, v, owner, err := s.Claim(ctx, "bin", time.Minute); err != nil || st != store.Done || string(v) != string(bin) || owner != "" {
		t.Fatalf("Claim after Complete(ttl 0) and the pending ttl = %v, %q, %v; want done, %q", st, v, err, bin)
	}
	if st, v, err := s.Lookup(ctx, "bin"); err != nil || st != store.Done || string(v) != string(bin) {
		t.Fatalf("Lookup = %v, %q, %v", st, v, err)
	}
	if st, v, owner, err := s.Claim(ctx, "forever", time.Minute); err != nil || st != store.Pending || v != nil || owner != "" {
		t.Fatalf("Claim of a key claimed with no ttl = %v, %q, owner %q, %v; want pending, no value or token shown", st, v, owner, err)
	}
	if st, v, err := s.Lookup(ctx, "forever"); err != nil || st != store.Pending || v != nil {
		t.Fatalf("Lookup of a pending key = %v, %q, %v; want pending, its owner's token not shown", st, v, err)
	}
	// Completing with an empty value is still a done record.
	if err := s.Complete(ctx, "forever", foreverOwner, nil, 0); err != nil {
		t.Fatal(err)
	}
	if st, v, err := s.Lookup(ctx, "forever"); err != nil || st != store.Done || len(v) != 0 {
		t.Fatalf("Lookup after Complete(nil) = %v, %q, %v; want done, empty", st, v, err)
	}
}

func testWallet(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.Debit(ctx, "w-missing", store.Debit{Hops: 1}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Debit(missing) = %v, want ErrNotFound", err)
	}
	start := &handoffv1.Budget{UsdRemainingMicros: 1000, RevisionsRemaining: 1, HopsRemaining: 2}
	if _, err := s.OpenWallet(ctx, "w", "job-w", start); err != nil {
		t.Fatal(err)
	}
	// Opening again (a retried submit) changes nothing.
	if got, err := s.OpenWallet(ctx, "w", "job-w", &handoffv1.Budget{UsdRemainingMicros: 5}); err != nil || !proto.Equal(got, start) {
		t.Fatalf("reopen = %v, %v; want the first budget", got, err)
	}
	got, err := s.Debit(ctx, "w", store.Debit{Hops: 1, USDMicros: 400, RequireMoney: true})
	if err != nil || got.GetUsdRemainingMicros() != 600 || got.GetHopsRemaining() != 1 {
		t.Fatalf("Debit = %v, %v", got, err)
	}
	if _, err := s.Debit(ctx, "w", store.Debit{Revisions: 2}); !errors.Is(err, store.ErrWalletEmpty) {
		t.Fatalf("Debit of 2 revisions from 1 = %v, want ErrWalletEmpty", err)
	}
	// Spend beyond what is left: clamped at zero, never negative.
	got, err = s.Debit(ctx, "w", store.Debit{Hops: 1, USDMicros: 5000})
	if err != nil || got.GetUsdRemainingMicros() != 0 || got.GetHopsRemaining() != 0 || got.GetRevisionsRemaining() != 1 {
		t.Fatalf("overspend = %v, %v; want money 0, hops 0, revisions untouched", got, err)
	}
	if _, err := s.Debit(ctx, "w", store.Debit{RequireMoney: true}); !errors.Is(err, store.ErrWalletEmpty) {
		t.Fatalf("RequireMoney on an empty wallet = %v, want ErrWalletEmpty", err)
	}
	if w, err := s.Wallet(ctx, "w"); err != nil || w.GetUsdRemainingMicros() != 0 || w.GetRevisionsRemaining() != 1 {
		t.Fatalf("Wallet = %v, %v; a refused debit must take nothing", w, err)
	}
}

func testConcurrentDebit(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.OpenWallet(ctx, "hot", "job-hot", &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 10}); err != nil {
		t.Fatal(err)
	}
	ok, empty := RaceDebits(t, []store.Store{s}, "hot", store.Debit{Hops: 1, USDMicros: 1, RequireMoney: true})
	w, err := s.Wallet(ctx, "hot")
	if err != nil || ok != 10 || empty != 90 || w.GetHopsRemaining() != 0 || w.GetUsdRemainingMicros() != 1_000_000-10 {
		t.Fatalf("100 concurrent debits on 10 hops: %d ok, %d empty, wallet %v (%v); want 10, 90, hops 0", ok, empty, w, err)
	}
}

func testRuns(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.GetRun(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetRun(missing) = %v, want ErrNotFound", err)
	}
	job := &handoffv1.Job{RunId: "run-1", JobId: "tkt_1", RequestId: "req-1", Goal: "g", State: handoffv1.JobState_JOB_STATE_RUNNING,
		Wallet: &handoffv1.Budget{UsdRemainingMicros: 5_000, RevisionsRemaining: 2, HopsRemaining: 7}}
	submitted := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED, Stage: "intake"}
	got, created, err := s.CreateRun(ctx, job, submitted)
	if err != nil || !created || !proto.Equal(got, job) {
		t.Fatalf("CreateRun = %v, %v, %v; want the job, created", got, created, err)
	}
	// Its wallet and first event came with it.
	if w, err := s.Wallet(ctx, "run-1"); err != nil || !proto.Equal(w, job.GetWallet()) {
		t.Fatalf("wallet of the new run = %v, %v; want %v", w, err, job.GetWallet())
	}
	if evs, err := s.Events(ctx, "run-1", 0); err != nil || len(evs) != 1 || evs[0].GetKind() != handoffv1.EventKind_EVENT_KIND_SUBMITTED || evs[0].GetSeq() != 1 || submitted.GetSeq() != 1 {
		t.Fatalf("events of the new run = %v, %v (seq set %d); want SUBMITTED as 1", evs, err, submitted.GetSeq())
	}
	// Same request id and request, new run id: the first run comes back, nothing new is
	// stored. (A different request under that id is testSubmitRules'.)
	again := proto.Clone(job).(*handoffv1.Job)
	again.RunId = "run-2"
	got, created, err = s.CreateRun(ctx, again, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED})
	if err != nil || created || got.GetRunId() != "run-1" {
		t.Fatalf("CreateRun(same request id) = %v, %v, %v; want run-1, not created", got.GetRunId(), created, err)
	}
	if _, err := s.GetRun(ctx, "run-2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("run-2 was stored although its request id was a retry: %v", err)
	}
	if _, err := s.Wallet(ctx, "run-2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("run-2's wallet was opened although its request id was a retry: %v", err)
	}
	if evs, err := s.Events(ctx, "run-1", 1); err != nil || len(evs) != 0 {
		t.Fatalf("the retry appended events %v, %v; want none", evs, err)
	}
	// A wallet that exists is left as it is (as OpenWallet does).
	if _, err := s.OpenWallet(ctx, "run-3", "tkt_3", &handoffv1.Budget{HopsRemaining: 9}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-3", JobId: "tkt_3", Wallet: &handoffv1.Budget{HopsRemaining: 1}}); err != nil {
		t.Fatal(err)
	}
	if w, err := s.Wallet(ctx, "run-3"); err != nil || w.GetHopsRemaining() != 9 {
		t.Fatalf("wallet opened before its run = %v, %v; want it unchanged (9 hops)", w, err)
	}
	job.State = handoffv1.JobState_JOB_STATE_COMPLETED
	job.Hops = 5
	if err := s.PutRun(ctx, job); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetRun(ctx, "run-1")
	if err != nil || got.GetHops() != 5 || got.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("GetRun after PutRun = %v, %v", got, err)
	}
	if err := s.PutRun(ctx, &handoffv1.Job{RunId: "never-created"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("PutRun(unknown) = %v, want ErrNotFound", err)
	}
}

func testListRuns(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		st := handoffv1.JobState_JOB_STATE_COMPLETED
		if i%2 == 0 {
			st = handoffv1.JobState_JOB_STATE_ESCALATED
		}
		if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: fmt.Sprintf("run-%d", i), State: st}); err != nil {
			t.Fatal(err)
		}
	}
	ids := PagedRunIDs(t, s, 0, 2, 10)
	if fmt.Sprint(ids) != "[run-5 run-4 run-3 run-2 run-1]" {
		t.Fatalf("paged listing = %v, want newest first, each once", ids)
	}
	runs, _, err := s.ListRuns(ctx, handoffv1.JobState_JOB_STATE_ESCALATED, 10, "")
	if err != nil || len(runs) != 2 || runs[0].GetRunId() != "run-4" {
		t.Fatalf("state filter = %v, %v; want run-4, run-2", runs, err)
	}
}

func testEvents(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.AppendEvent(ctx, "missing", &handoffv1.JobEvent{}); err == nil {
		t.Fatal("AppendEvent to a missing run succeeded")
	}
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		ev := &handoffv1.JobEvent{Stage: fmt.Sprint("s", i)}
		seq, err := s.AppendEvent(ctx, "r", ev)
		if err != nil || seq != uint64(i) || ev.GetSeq() != seq {
			t.Fatalf("AppendEvent #%d = %d, %v (event's seq %d)", i, seq, err, ev.GetSeq())
		}
	}
	evs, err := s.Events(ctx, "r", 1)
	if err != nil || len(evs) != 2 || evs[0].GetSeq() != 2 || evs[1].GetStage() != "s3" {
		t.Fatalf("Events(after 1) = %v, %v", evs, err)
	}

	// PutRun with events: the run and the events together, numbered after the others.
	run := &handoffv1.Job{RunId: "r", Stage: "after", Hops: 4}
	s4, s5 := &handoffv1.JobEvent{Stage: "s4", Seq: 99}, &handoffv1.JobEvent{Stage: "s5"}
	if err := s.PutRun(ctx, run, s4, s5); err != nil {
		t.Fatal(err)
	}
	if s4.GetSeq() != 4 || s5.GetSeq() != 5 {
		t.Fatalf("PutRun set the events' seqs to %d, %d; want 4, 5 (their places in the timeline)", s4.GetSeq(), s5.GetSeq())
	}
	if got, err := s.GetRun(ctx, "r"); err != nil || !proto.Equal(got, run) {
		t.Fatalf("run after PutRun with events = %v, %v; want %v", got, err, run)
	}
	evs, err = s.Events(ctx, "r", 3)
	if err != nil || len(evs) != 2 || evs[0].GetSeq() != 4 || evs[0].GetStage() != "s4" || evs[1].GetSeq() != 5 || evs[1].GetStage() != "s5" {
		t.Fatalf("events written with PutRun = %v, %v; want s4 as seq 4 (its own seq ignored), s5 as 5", evs, err)
	}
	// A run that does not exist gets neither: no events without their run.
	if err := s.PutRun(ctx, &handoffv1.Job{RunId: "ghost"}, &handoffv1.JobEvent{Stage: "x"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("PutRun of a missing run with events = %v, want ErrNotFound", err)
	}
	if _, err := s.Events(ctx, "ghost", 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Events of the missing run = %v, want ErrNotFound (nothing written)", err)
	}
}

// testEventsWhole: an event is stored whole, nested messages and all, under the seq the
// timeline gives it (whatever seq it came with), by each way of writing events; the
// caller's event keeps every other field as given, and a write that fails leaves it as it
// was.
func testEventsWhole(t *testing.T, s store.Store) {
	ctx := context.Background()
	full := func(stage string, seq uint64) *handoffv1.JobEvent {
		return &handoffv1.JobEvent{
			Seq: seq, RunId: "w", JobId: "job-w", Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: stage, Hop: 3,
			Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			Wallet:      &handoffv1.Budget{WalletId: "w", UsdRemainingMicros: 5, HopsRemaining: 2},
			Package: &handoffv1.HandoffPackage{JobId: "job-w", Stage: stage, Goal: "g",
				Artifacts: []*handoffv1.Artifact{{Uri: "file:///a", Type: "t"}}},
			Ack: &handoffv1.Ack{JobId: "job-w", Stage: stage, Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED},
		}
	}
	created := full("created", 7)
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "w"}, created); err != nil {
		t.Fatal(err)
	}
	appended := full("appended", 0)
	if _, err := s.AppendEvent(ctx, "w", appended); err != nil {
		t.Fatal(err)
	}
	put1, put2 := full("put1", 0), full("put2", 99)
	if err := s.PutRun(ctx, &handoffv1.Job{RunId: "w", Hops: 1}, put1, put2); err != nil {
		t.Fatal(err)
	}
	given := []*handoffv1.JobEvent{created, appended, put1, put2}
	want := []*handoffv1.JobEvent{full("created", 1), full("appended", 2), full("put1", 3), full("put2", 4)}
	for i := range given {
		if !proto.Equal(given[i], want[i]) {
			t.Fatalf("caller's event %d after its write = %v; want %v (only the seq set)", i, given[i], want[i])
		}
	}
	evs, err := s.Events(ctx, "w", 0)
	if err != nil || len(evs) != len(want) {
		t.Fatalf("Events = %d events, %v; want %d", len(evs), err, len(want))
	}
	for i := range want {
		if !proto.Equal(evs[i], want[i]) {
			t.Fatalf("stored event %d = %v; want %v", i, evs[i], want[i])
		}
	}
	lost := full("lost", 5)
	if _, err := s.AppendEvent(ctx, "no-such-run", lost); err == nil {
		t.Fatal("AppendEvent to a missing run succeeded")
	}
	if err := s.PutRun(ctx, &handoffv1.Job{RunId: "no-such-run"}, lost); err == nil {
		t.Fatal("PutRun of a missing run succeeded")
	}
	if !proto.Equal(lost, full("lost", 5)) {
		t.Fatalf("event of failed writes = %v; want it as given", lost)
	}
}

func testClaim(t *testing.T, s store.Store) {
	ctx := context.Background()
	key := "job:stage:type"
	if st, _, err := s.Lookup(ctx, key); err != nil || st != 0 {
		t.Fatalf("Lookup(fresh) = %v, %v", st, err)
	}
	st, _, first, err := s.Claim(ctx, key, time.Minute)
	if err != nil || st != store.Claimed || first == "" {
		t.Fatalf("first Claim = %v, owner %q, %v; want claimed with an owner token", st, first, err)
	}
	if st, _, owner, err := s.Claim(ctx, key, time.Minute); err != nil || st != store.Pending || owner != "" {
		t.Fatalf("second Claim = %v, owner %q, %v; want pending, no token", st, owner, err)
	}
	if err := s.Release(ctx, key, first); err != nil {
		t.Fatal(err)
	}
	st, _, second, err := s.Claim(ctx, key, time.Minute)
	if err != nil || st != store.Claimed || second == "" || second == first {
		t.Fatalf("Claim after Release = %v, owner %q (first %q), %v; want claimed with a new token", st, second, first, err)
	}
	if err := s.Complete(ctx, key, second, []byte("receipt-1"), 0); err != nil {
		t.Fatal(err)
	}
	st, v, _, err := s.Claim(ctx, key, time.Minute)
	if err != nil || st != store.Done || string(v) != "receipt-1" {
		t.Fatalf("Claim after Complete = %v, %q, %v; want done with the receipt", st, v, err)
	}
	if err := s.Complete(ctx, key, second, []byte("receipt-1"), 0); err != nil {
		t.Fatalf("Complete again with the same result (a retry whose first attempt landed) = %v", err)
	}
	if err := s.Release(ctx, key, second); err != nil {
		t.Fatal(err)
	}
	if st, v, _ := s.Lookup(ctx, key); st != store.Done || string(v) != "receipt-1" {
		t.Fatalf("Release dropped a completed record: %v %q", st, v)
	}
}

func testClaimExpiry(t *testing.T, s store.Store) {
	ctx := context.Background()
	if st, _, _, _ := s.Claim(ctx, "k-exp", 50*time.Millisecond); st != store.Claimed {
		t.Fatalf("claim = %v", st)
	}
	time.Sleep(120 * time.Millisecond)
	st, _, owner, err := s.Claim(ctx, "k-exp", time.Minute)
	if err != nil || st != store.Claimed {
		t.Fatalf("Claim after the pending marker expired = %v, %v; want claimed", st, err)
	}
	if err := s.Complete(ctx, "k-exp", owner, []byte("r"), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(120 * time.Millisecond)
	if st, _, _ := s.Lookup(ctx, "k-exp"); st != 0 {
		t.Fatalf("record outlived its ttl: %v", st)
	}
}

// testRenewClaim: a pending claim renewed within its ttl outlives it; a done, released or
// lapsed key is not renewed (and not brought back); bad arguments are refused.
func testRenewClaim(t *testing.T, s store.Store) {
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	owners := map[string]string{}
	claim := func(key string, ttl time.Duration) {
		t.Helper()
		st, _, owner, err := s.Claim(ctx, key, ttl)
		if err != nil || st != store.Claimed {
			t.Fatalf("claim %s = %v, %v", key, st, err)
		}
		owners[key] = owner
	}
	renew := func(key string, want bool) {
		t.Helper()
		owner := owners[key]
		if owner == "" {
			owner = "no-such-owner"
		}
		ok, err := s.RenewClaim(ctx, key, owner, ttl)
		if err != nil || ok != want {
			t.Fatalf("RenewClaim(%s) = %v, %v; want %v", key, ok, err, want)
		}
	}
	// Renewals 200ms apart keep a 600ms claim: 400ms of room for the writes between them
	// on a loaded machine, where 100ms was not enough.
	claim("k-renew", ttl)
	for range 5 { // 1s in all: past the first ttl
		time.Sleep(200 * time.Millisecond)
		renew("k-renew", true)
		if st, _, _, err := s.Claim(ctx, "k-renew", time.Minute); err != nil || st != store.Pending {
			t.Fatalf("Claim of a renewed claim = %v, %v; want pending", st, err)
		}
	}
	time.Sleep(ttl + 300*time.Millisecond) // no renewal: it lapses
	renew("k-renew", false)
	if st, _, _ := s.Lookup(ctx, "k-renew"); st != 0 {
		t.Fatalf("a renewal of a lapsed claim brought it back: %v", st)
	}
	renew("k-never", false)
	if st, _, _ := s.Lookup(ctx, "k-never"); st != 0 {
		t.Fatalf("a renewal of no claim made one: %v", st)
	}
	claim("k-done", time.Minute)
	if err := s.Complete(ctx, "k-done", owners["k-done"], []byte("r"), 0); err != nil {
		t.Fatal(err)
	}
	renew("k-done", false)
	if st, v, _ := s.Lookup(ctx, "k-done"); st != store.Done || string(v) != "r" {
		t.Fatalf("a renewal touched a done record: %v %q", st, v)
	}
	claim("k-rel", time.Minute)
	if err := s.Release(ctx, "k-rel", owners["k-rel"]); err != nil {
		t.Fatal(err)
	}
	renew("k-rel", false)
	for _, c := range []struct {
		key, owner string
		ttl        time.Duration
	}{{"", "o", time.Second}, {"k", "o", 0}, {"k", "o", -time.Second}, {"k", "", time.Second}} {
		if ok, err := s.RenewClaim(ctx, c.key, c.owner, c.ttl); err == nil || ok {
			t.Errorf("RenewClaim(%q, %q, %s) = %v, %v; want an error", c.key, c.owner, c.ttl, ok, err)
		}
	}
}

func testConcurrentClaim(t *testing.T, s store.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[store.ClaimState]int{}
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _, _, err := s.Claim(ctx, "contended", time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			counts[st]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if counts[store.Claimed] != 1 || counts[store.Pending] != 99 {
		t.Fatalf("100 concurrent claims: %v; want exactly one claimed", counts)
	}
}

// PagedRunIDs lists runs (in one state, or all for 0) page by page, pageSize at a time, and
// returns their ids in the order the pages gave them; it fails the test after maxPages
// pages, so a page token that never ends cannot hang it.
func PagedRunIDs(t testing.TB, s store.Runs, state handoffv1.JobState, pageSize, maxPages int) []string {
	t.Helper()
	var ids []string
	token := ""
	for page := 0; page < maxPages; page++ {
		runs, next, err := s.ListRuns(context.Background(), state, pageSize, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			ids = append(ids, r.GetRunId())
		}
		if next == "" {
			return ids
		}
		token = next
	}
	t.Fatalf("listing did not end after %d pages of %d: %v", maxPages, pageSize, ids)
	return nil
}

// testAdmit: Admit is Claim, then Debit only for a fresh claim; a refused debit keeps the
// claim and takes nothing; a held key debits nothing.
func testAdmit(t *testing.T, s store.Store) {
	ctx := context.Background()
	hop := store.Debit{Hops: 1, RequireMoney: true}
	if _, err := s.OpenWallet(ctx, "w", "job-w", &handoffv1.Budget{UsdRemainingMicros: 500, RevisionsRemaining: 1, HopsRemaining: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, "", time.Minute, "w", hop); err == nil {
		t.Fatal("Admit with an empty key: no error")
	}

	a, err := s.Admit(ctx, "k1", time.Minute, "w", hop)
	if err != nil || a.State != store.Claimed || !a.Debited || a.DebitErr != nil ||
		!proto.Equal(a.Wallet, &handoffv1.Budget{UsdRemainingMicros: 500, RevisionsRemaining: 1, HopsRemaining: 0}) {
		t.Fatalf("first Admit = %+v, %v; want claimed, debited to 0 hops", a, err)
	}
	// The key is held: a second Admit is Pending and takes nothing (the wallet has no hop left
	// anyway, so a debit would have shown as empty).
	if a, err := s.Admit(ctx, "k1", time.Minute, "w", hop); err != nil || a.State != store.Pending || a.Debited || a.DebitErr != nil {
		t.Fatalf("Admit of a pending key = %+v, %v; want pending, no debit", a, err)
	}
	if a.Owner == "" {
		t.Fatalf("first Admit claimed k1 with no owner token: %+v", a)
	}
	if err := s.Complete(ctx, "k1", a.Owner, []byte("result-1"), 0); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Admit(ctx, "k1", time.Minute, "w", hop); err != nil || a.State != store.Done || string(a.Value) != "result-1" || a.Debited {
		t.Fatalf("Admit of a done key = %+v, %v; want done with the result, no debit", a, err)
	}

	// Empty wallet: claimed, not debited, the wallet as it is, and the claim kept.
	a, err = s.Admit(ctx, "k2", time.Minute, "w", hop)
	if err != nil || a.State != store.Claimed || a.Debited || !errors.Is(a.DebitErr, store.ErrWalletEmpty) ||
		a.Wallet.GetHopsRemaining() != 0 || a.Wallet.GetUsdRemainingMicros() != 500 {
		t.Fatalf("Admit on an empty wallet = %+v, %v; want claimed, ErrWalletEmpty, wallet unchanged", a, err)
	}
	if st, _, _ := s.Lookup(ctx, "k2"); st != store.Pending {
		t.Fatalf("after a refused debit the key is %v, want still pending (the caller releases it)", st)
	}
	if w, _ := s.Wallet(ctx, "w"); w.GetHopsRemaining() != 0 || w.GetUsdRemainingMicros() != 500 || w.GetRevisionsRemaining() != 1 {
		t.Fatalf("a refused debit changed the wallet: %v", w)
	}

	// No such wallet: claimed, ErrNotFound.
	if a, err := s.Admit(ctx, "k3", time.Minute, "nobody", hop); err != nil || a.State != store.Claimed || a.Debited || !errors.Is(a.DebitErr, store.ErrNotFound) || a.Wallet != nil {
		t.Fatalf("Admit on a missing wallet = %+v, %v; want claimed, ErrNotFound", a, err)
	}
	// No wallet named: a plain claim.
	if a, err := s.Admit(ctx, "k4", time.Minute, "", hop); err != nil || a.State != store.Claimed || a.Debited || a.DebitErr != nil {
		t.Fatalf("Admit without a wallet = %+v, %v; want claimed only", a, err)
	}
	// A key whose claim was released (or lapsed) after its debit is not charged again by
	// the same wallet: the retry is claimed, reported paid, and the wallet is unchanged.
	// Another wallet pays for the same key on its own.
	for _, id := range []string{"w2", "w3"} {
		if _, err := s.OpenWallet(ctx, id, "job-"+id, &handoffv1.Budget{UsdRemainingMicros: 500, HopsRemaining: 5}); err != nil {
			t.Fatal(err)
		}
	}
	a, err = s.Admit(ctx, "kp", time.Minute, "w2", hop)
	if err != nil || !a.Debited || a.Paid || a.Wallet.GetHopsRemaining() != 4 {
		t.Fatalf("first Admit of kp = %+v, %v; want debited to 4 hops", a, err)
	}
	if err := s.Release(ctx, "kp", a.Owner); err != nil {
		t.Fatal(err)
	}
	a, err = s.Admit(ctx, "kp", time.Minute, "w2", hop)
	if err != nil || a.State != store.Claimed || !a.Debited || !a.Paid || a.DebitErr != nil || a.Wallet.GetHopsRemaining() != 4 {
		t.Fatalf("Admit of kp after its release = %+v, %v; want claimed, already paid, still 4 hops", a, err)
	}
	if w, _ := s.Wallet(ctx, "w2"); w.GetHopsRemaining() != 4 {
		t.Fatalf("w2 holds %d hops after a retried key; want 4 (charged once)", w.GetHopsRemaining())
	}
	if err := s.Release(ctx, "kp", a.Owner); err != nil {
		t.Fatal(err)
	}
	a, err = s.Admit(ctx, "kp", time.Minute, "w3", hop)
	if err != nil || !a.Debited || a.Paid || a.Wallet.GetHopsRemaining() != 4 {
		t.Fatalf("Admit of kp from another wallet = %+v, %v; want a debit of its own", a, err)
	}
	// Unpay (the hop ran and failed): the next Admit of the key is a new hop, debited again.
	if err := s.Unpay(ctx, "w2", "kp"); err != nil {
		t.Fatal(err)
	}
	if err := s.Unpay(ctx, "nobody", "nothing"); err != nil {
		t.Fatalf("Unpay of an unknown wallet and key = %v, want nil", err)
	}
	if err := s.Release(ctx, "kp", a.Owner); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Admit(ctx, "kp", time.Minute, "w2", hop); err != nil || !a.Debited || a.Paid || a.Wallet.GetHopsRemaining() != 3 {
		t.Fatalf("Admit of kp after Unpay = %+v, %v; want a new debit, 3 hops left", a, err)
	}

	// A debit that would add money is refused before anything is written.
	if _, err := s.Admit(ctx, "k5", time.Minute, "w", store.Debit{USDMicros: -1}); err == nil {
		t.Fatal("Admit with a negative debit: no error")
	}
	if st, _, _ := s.Lookup(ctx, "k5"); st != 0 {
		t.Fatalf("a refused Admit left key k5 %v, want no record", st)
	}
}

// testConcurrentAdmit: 50 deliveries of the same key and 50 of distinct keys race on one
// wallet of 20 hops: the shared key is claimed and charged once, and no more hops are taken
// than the wallet holds.
func testConcurrentAdmit(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.OpenWallet(ctx, "hot", "job-hot", &handoffv1.Budget{UsdRemainingMicros: 1_000, HopsRemaining: 20}); err != nil {
		t.Fatal(err)
	}
	var sameClaimed, debited, empty atomic.Int32
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "same"
			if i%2 == 1 {
				key = fmt.Sprintf("k%d", i)
			}
			a, err := s.Admit(ctx, key, time.Minute, "hot", store.Debit{Hops: 1, RequireMoney: true})
			if err != nil {
				t.Error(err)
				return
			}
			if key == "same" && a.State == store.Claimed {
				sameClaimed.Add(1)
			}
			if a.Debited {
				debited.Add(1)
			}
			if errors.Is(a.DebitErr, store.ErrWalletEmpty) {
				empty.Add(1)
			}
		}()
	}
	wg.Wait()
	w, err := s.Wallet(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	// 51 claims (1 shared + 50 distinct) compete for 20 hops.
	if sameClaimed.Load() != 1 || debited.Load() != 20 || empty.Load() != 31 || w.GetHopsRemaining() != 0 {
		t.Fatalf("same key claimed %d times (want 1), %d debited (want 20), %d empty (want 31), wallet %v",
			sameClaimed.Load(), debited.Load(), empty.Load(), w)
	}
}

// RaceDebits makes 100 concurrent Debits of d from wallet id, spread over stores in turn
// (several clients of one server), and returns how many succeeded and how many found the
// wallet empty; any other error fails the test.
func RaceDebits(t *testing.T, stores []store.Store, id string, d store.Debit) (ok, empty int32) {
	t.Helper()
	var okN, emptyN atomic.Int32
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := stores[i%len(stores)].Debit(context.Background(), id, d)
			switch {
			case err == nil:
				okN.Add(1)
			case errors.Is(err, store.ErrWalletEmpty):
				emptyN.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return okN.Load(), emptyN.Load()
}

// testClaimOwner: a holder whose claim lapsed while another caller claimed the key can
// neither renew, release nor complete that caller's claim (ErrNotOwner, nothing written),
// nor write its ledger entry and record; the new owner's record is never overwritten.
func testClaimOwner(t *testing.T, s store.Store) {
	ctx := context.Background()
	st, _, stale, err := s.Claim(ctx, "k-own", 100*time.Millisecond)
	if err != nil || st != store.Claimed || stale == "" {
		t.Fatalf("Claim = %v, owner %q, %v", st, stale, err)
	}
	time.Sleep(200 * time.Millisecond) // the first holder stalls: its claim lapses
	st, _, owner, err := s.Claim(ctx, "k-own", time.Minute)
	if err != nil || st != store.Claimed || owner == "" || owner == stale {
		t.Fatalf("Claim after the lapse = %v, owner %q (stale %q), %v; want claimed under a new token", st, owner, stale, err)
	}
	pendingUnder := func(what, who string) {
		t.Helper()
		if st, _, _ := s.Lookup(ctx, "k-own"); st != store.Pending {
			t.Fatalf("after %s the key is %v; want still pending", what, st)
		}
		if ok, err := s.RenewClaim(ctx, "k-own", who, time.Minute); err != nil || !ok {
			t.Fatalf("after %s the claim is not %s's: RenewClaim = %v, %v", what, who, ok, err)
		}
	}
	if ok, err := s.RenewClaim(ctx, "k-own", stale, time.Minute); ok || !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale RenewClaim = %v, %v; want false, ErrNotOwner", ok, err)
	}
	pendingUnder("a stale renewal", owner)
	if err := s.Complete(ctx, "k-own", stale, []byte("stale"), 0); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Complete = %v; want ErrNotOwner", err)
	}
	pendingUnder("a stale Complete", owner)
	if err := s.Release(ctx, "k-own", stale); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Release = %v; want ErrNotOwner", err)
	}
	pendingUnder("a stale Release", owner)
	if _, _, err := s.AppendLedgerComplete(ctx, "ledger-own", []byte("stale"), "k-own", stale, 0, receiptOf); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale AppendLedgerComplete = %v; want ErrNotOwner", err)
	}
	pendingUnder("a stale AppendLedgerComplete", owner)
	if _, ok := ledgerByKey(t, s)["ledger-own"]; ok {
		t.Fatal("a stale AppendLedgerComplete made its ledger entry")
	}
	if err := s.Complete(ctx, "k-own", owner, []byte("new"), 0); err != nil {
		t.Fatalf("the owner's Complete = %v", err)
	}
	if err := s.Complete(ctx, "k-own", stale, []byte("stale"), 0); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale Complete after the owner's = %v; want ErrNotOwner", err)
	}
	if err := s.Complete(ctx, "k-own", owner, []byte("other"), 0); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("Complete of a done key with another result = %v; want ErrNotOwner", err)
	}
	if _, _, err := s.AppendLedgerComplete(ctx, "ledger-own", []byte("stale"), "k-own", stale, 0, receiptOf); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("stale AppendLedgerComplete of a done key = %v; want ErrNotOwner", err)
	}
	if err := s.Release(ctx, "k-own", stale); err != nil {
		t.Fatalf("Release of a done key = %v; want nil (a done record is never released)", err)
	}
	if st, v, _ := s.Lookup(ctx, "k-own"); st != store.Done || string(v) != "new" {
		t.Fatalf("record = %v %q; want the owner's, done with %q", st, v, "new")
	}
	if _, ok := ledgerByKey(t, s)["ledger-own"]; ok {
		t.Fatal("a stale AppendLedgerComplete of a done key made its ledger entry")
	}

	// A claim that lapsed with nobody claiming the key since: its holder still completes
	// it (its result is the key's first), and releases it.
	st, _, late, _ := s.Claim(ctx, "k-late", 50*time.Millisecond)
	if st != store.Claimed {
		t.Fatalf("Claim k-late = %v", st)
	}
	time.Sleep(120 * time.Millisecond)
	if err := s.Complete(ctx, "k-late", late, []byte("late"), 0); err != nil {
		t.Fatalf("Complete of a lapsed claim nobody took = %v", err)
	}
	if st, v, _ := s.Lookup(ctx, "k-late"); st != store.Done || string(v) != "late" {
		t.Fatalf("record = %v %q; want done with %q", st, v, "late")
	}
	if err := s.Release(ctx, "k-free", "anyone"); err != nil {
		t.Fatalf("Release of a free key = %v; want nil", err)
	}
	for _, c := range []struct{ key, owner string }{{"", "o"}, {"k", ""}} {
		if err := s.Complete(ctx, c.key, c.owner, []byte("x"), 0); err == nil || errors.Is(err, store.ErrNotOwner) {
			t.Errorf("Complete(%q, owner %q) = %v; want an argument error", c.key, c.owner, err)
		}
		if err := s.Release(ctx, c.key, c.owner); err == nil || errors.Is(err, store.ErrNotOwner) {
			t.Errorf("Release(%q, owner %q) = %v; want an argument error", c.key, c.owner, err)
		}
	}
}
