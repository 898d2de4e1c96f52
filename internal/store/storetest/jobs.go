package storetest

// Contract tests of what keeps jobs apart: a wallet pays only for its own job, and job_id
// and request_id are not first-come (store.CreateRun).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// testWalletJob: a wallet records its job; a debit, an admission or a checked read naming
// another job is refused (ErrWrongJob) and takes and shows nothing; an unknown wallet is
// ErrNotFound.
func testWalletJob(t *testing.T, s store.Store) {
	ctx := context.Background()
	start := &handoffv1.Budget{UsdRemainingMicros: 900, RevisionsRemaining: 1, HopsRemaining: 6}
	if _, err := s.OpenWallet(ctx, "wa", "job-a", start); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenWallet(ctx, "wb", "job-b", start); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenWallet(ctx, "wz", "", start); err == nil {
		t.Fatal("OpenWallet without a job succeeded")
	}
	if _, err := s.OpenWallet(ctx, "wa", "job-b", start); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("OpenWallet of job-a's wallet for job-b = %v, want ErrWrongJob", err)
	}
	hop := store.Debit{Hops: 1, RequireMoney: true}
	if _, err := s.Debit(ctx, "wa", store.Debit{Hops: 1, RequireMoney: true, Job: "job-b"}); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("Debit of job-a's wallet for job-b = %v, want ErrWrongJob", err)
	}
	if _, err := s.Debit(ctx, "nowhere", store.Debit{Hops: 1, Job: "job-a"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Debit of a missing wallet for a job = %v, want ErrNotFound", err)
	}
	if w, err := s.Debit(ctx, "wa", store.Debit{Hops: 1, RequireMoney: true, Job: "job-a"}); err != nil || w.GetHopsRemaining() != 5 {
		t.Fatalf("Debit of job-a's wallet for job-a = %v, %v; want 5 hops left", w, err)
	}
	// A wrong job is refused before the amounts: an empty wallet of another job says
	// ErrWrongJob, not ErrWalletEmpty (which would tell the caller it is empty).
	if _, err := s.Debit(ctx, "wa", store.Debit{Hops: 99, Job: "job-b"}); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("over-large Debit for the wrong job = %v, want ErrWrongJob", err)
	}

	if w, err := s.WalletFor(ctx, "wa", "job-a"); err != nil || w.GetHopsRemaining() != 5 {
		t.Fatalf("WalletFor(wa, job-a) = %v, %v; want 5 hops", w, err)
	}
	if w, err := s.WalletFor(ctx, "wa", "job-b"); !errors.Is(err, store.ErrWrongJob) || w != nil {
		t.Fatalf("WalletFor(wa, job-b) = %v, %v; want nothing, ErrWrongJob", w, err)
	}
	if _, err := s.WalletFor(ctx, "nowhere", "job-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("WalletFor(missing) = %v, want ErrNotFound", err)
	}

	// Admit for the wrong job: claimed (the caller releases it), nothing debited or shown,
	// and no paid mark left behind for the right job's own delivery of that key.
	a, err := s.Admit(ctx, "stage:job-b:draft:0", time.Minute, "wa", store.Debit{Hops: 1, RequireMoney: true, Job: "job-b"})
	if err != nil || a.State != store.Claimed || a.Debited || a.Paid || !errors.Is(a.DebitErr, store.ErrWrongJob) || a.Wallet != nil {
		t.Fatalf("Admit from another job's wallet = %+v, %v; want claimed, ErrWrongJob, no wallet shown", a, err)
	}
	if w, _ := s.Wallet(ctx, "wa"); w.GetHopsRemaining() != 5 {
		t.Fatalf("wa holds %d hops after another job's Admit; want 5 (untouched)", w.GetHopsRemaining())
	}
	if a, err := s.Admit(ctx, "k-missing", time.Minute, "nowhere", store.Debit{Hops: 1, Job: "job-a"}); err != nil || !errors.Is(a.DebitErr, store.ErrNotFound) || a.Debited {
		t.Fatalf("Admit from a missing wallet = %+v, %v; want ErrNotFound", a, err)
	}
	if err := s.Release(ctx, "stage:job-b:draft:0", a.Owner); err != nil {
		t.Fatal(err)
	}
	hop.Job = "job-b"
	if a, err := s.Admit(ctx, "stage:job-b:draft:0", time.Minute, "wb", hop); err != nil || !a.Debited || a.Paid || a.Wallet.GetHopsRemaining() != 5 {
		t.Fatalf("Admit from job-b's own wallet = %+v, %v; want debited to 5 hops", a, err)
	}

	// A run's wallet, opened by CreateRun, is the run's job's.
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-w", JobId: "job-c", Goal: "g", Wallet: start}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WalletFor(ctx, "run-w", "job-c"); err != nil {
		t.Fatalf("WalletFor(run-w, job-c) = %v; want the run's wallet", err)
	}
	if _, err := s.WalletFor(ctx, "run-w", "job-a"); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("WalletFor(run-w, job-a) = %v; want ErrWrongJob", err)
	}
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-nojob", Wallet: start}); err == nil {
		t.Fatal("CreateRun of a run with a wallet and no job_id succeeded")
	}
	// A wallet opened under a run id for another job: CreateRun refuses that run whole.
	if _, err := s.OpenWallet(ctx, "run-taken", "job-a", start); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-taken", JobId: "job-d", Goal: "g", Wallet: start}); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("CreateRun over another job's wallet = %v, want ErrWrongJob", err)
	}
	if _, err := s.GetRun(ctx, "run-taken"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused run was stored: %v", err)
	}
}

// submitted is a run of job tkt_s as the coordinator creates it.
func submitted(runID, requestID string) *handoffv1.Job {
	return &handoffv1.Job{
		RunId: runID, JobId: "tkt_s", RequestId: requestID, Pipeline: "support", Goal: "triage the ticket",
		Constraints: []string{"no refund promises", "cite or say no_match"}, MemoryRefs: []string{"customer_id:cus_9"},
		Artifacts: []*handoffv1.Artifact{{Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", Uri: "file:///a/tkt_s/submit-r0/raw_ticket.json", Sha256: strings.Repeat("a", 64)}},
		State:     handoffv1.JobState_JOB_STATE_RUNNING,
		Wallet:    &handoffv1.Budget{UsdRemainingMicros: 1000, RevisionsRemaining: 2, HopsRemaining: 9},
	}
}

// testSubmitRules: CreateRun refuses a job_id submitted before with other content and a
// request_id used before for another request, atomically, and writes nothing for either;
// the same content is a repeat run, the same request its earlier run.
func testSubmitRules(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, created, err := s.CreateRun(ctx, submitted("run-1", "req-1")); err != nil || !created {
		t.Fatalf("first run = %v, %v", created, err)
	}
	// Same content, another budget, no request id: a repeat of the job, a run of its own.
	repeat := submitted("run-2", "")
	repeat.Wallet = &handoffv1.Budget{UsdRemainingMicros: 5, HopsRemaining: 1}
	repeat.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, created, err := s.CreateRun(ctx, repeat); err != nil || !created {
		t.Fatalf("repeat with the same content = %v, %v; want a new run", created, err)
	}
	edits := map[string]func(j *handoffv1.Job){
		"goal":              func(j *handoffv1.Job) { j.Goal = "refund the customer" },
		"constraints":       func(j *handoffv1.Job) { j.Constraints = nil },
		"constraints order": func(j *handoffv1.Job) { j.Constraints[0], j.Constraints[1] = j.Constraints[1], j.Constraints[0] },
		"pipeline":          func(j *handoffv1.Job) { j.Pipeline = "refunds" },
		"inputs":            func(j *handoffv1.Job) { j.Artifacts[0].Uri = "file:///etc/passwd" },
		"input digest":      func(j *handoffv1.Job) { j.Artifacts[0].Sha256 = "" },
		"memory_refs":       func(j *handoffv1.Job) { j.MemoryRefs = append(j.MemoryRefs, "order_id:ord_1") },
	}
	for name, edit := range edits {
		j := submitted("run-x", "req-x")
		edit(j)
		ev := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED}
		if _, created, err := s.CreateRun(ctx, j, ev); !errors.Is(err, store.ErrJobConflict) || created {
			t.Fatalf("job_id again with other %s = %v, %v; want ErrJobConflict", name, created, err)
		}
	}
	// Without a request id the job's content is checked all the same.
	for name, edit := range edits {
		j := submitted("run-y", "")
		edit(j)
		if _, created, err := s.CreateRun(ctx, j, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED}); !errors.Is(err, store.ErrJobConflict) || created {
			t.Fatalf("job_id again with other %s and no request id = %v, %v; want ErrJobConflict", name, created, err)
		}
	}
	if _, err := s.GetRun(ctx, "run-y"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused run without a request id was stored: %v", err)
	}
	// Nothing of the refused runs was written: no run, wallet, event or request record.
	if _, err := s.GetRun(ctx, "run-x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused run was stored: %v", err)
	}
	if _, err := s.Wallet(ctx, "run-x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused run's wallet was opened: %v", err)
	}
	if _, created, err := s.CreateRun(ctx, submitted("run-x", "req-x")); err != nil || !created {
		t.Fatalf("the same content under the refused run's request id = %v, %v; want created (nothing was recorded)", created, err)
	}

	// The same request again: the earlier run, nothing written.
	got, created, err := s.CreateRun(ctx, submitted("run-3", "req-1"), &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED})
	if err != nil || created || got.GetRunId() != "run-1" {
		t.Fatalf("same request again = %v, %v, %v; want run-1, not created", got.GetRunId(), created, err)
	}
	// The same request id with another request: refused, whatever differs. A different
	// content is told as a request conflict, which is what the caller got wrong.
	for name, edit := range map[string]func(j *handoffv1.Job){
		"budget": func(j *handoffv1.Job) { j.Wallet.HopsRemaining = 3 },
		"goal":   func(j *handoffv1.Job) { j.Goal = "something else" },
		"job_id": func(j *handoffv1.Job) { j.JobId = "tkt_other" },
	} {
		j := submitted("run-3", "req-1")
		edit(j)
		if _, created, err := s.CreateRun(ctx, j); !errors.Is(err, store.ErrRequestConflict) || created {
			t.Fatalf("request id again with another %s = %v, %v; want ErrRequestConflict", name, created, err)
		}
	}
	if _, err := s.GetRun(ctx, "run-3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused request stored its run: %v", err)
	}
	// Another job_id is another job: its own content.
	other := submitted("run-4", "")
	other.JobId, other.Goal = "tkt_other", "something else"
	if _, created, err := s.CreateRun(ctx, other); err != nil || !created {
		t.Fatalf("another job_id = %v, %v; want created", created, err)
	}

	// Ten submissions of one new job_id with ten goals at once: one run, nine refusals, with
	// request ids (each its own) and without.
	race := func(prefix, jobID string, withRequestIDs bool) (runs []string, conflicts int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := ""
				if withRequestIDs {
					req = fmt.Sprintf("%s-req-%d", prefix, i)
				}
				j := submitted(fmt.Sprintf("%s-%d", prefix, i), req)
				j.JobId, j.Goal = jobID, fmt.Sprintf("goal %d", i)
				_, created, err := s.CreateRun(ctx, j)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && created:
					runs = append(runs, j.GetRunId())
				case errors.Is(err, store.ErrJobConflict):
					conflicts++
				default:
					t.Errorf("%s submission %d = %v, %v", prefix, i, created, err)
				}
			}()
		}
		wg.Wait()
		return runs, conflicts
	}
	runs, conflicts := race("race", "tkt_race", true)
	if len(runs) != 1 || conflicts != 9 {
		t.Fatalf("10 racing submissions of one job_id: %d created %v, %d conflicts; want 1 and 9", len(runs), runs, conflicts)
	}
	if bare, bareConflicts := race("bare", "tkt_bare", false); len(bare) != 1 || bareConflicts != 9 {
		t.Fatalf("10 racing submissions of one job_id without request ids: %d created %v, %d conflicts; want 1 and 9", len(bare), bare, bareConflicts)
	}
	// The winner's content is the job's from now on.
	winner, err := s.GetRun(ctx, runs[0])
	if err != nil {
		t.Fatal(err)
	}
	again := proto.Clone(winner).(*handoffv1.Job)
	again.RunId, again.RequestId = "race-again", ""
	if _, created, err := s.CreateRun(ctx, again); err != nil || !created {
		t.Fatalf("the winner's content again = %v, %v; want a repeat run", created, err)
	}
}
