package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

const opToken = "s3cret-operator-token"

// startOp is start with an operator token and the relay pipeline.
func startOp(t *testing.T, maxRevisions int, verdicts []handoffv1.Verdict) *env {
	t.Helper()
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.draft = &recorder{name: "draft", spend: 100_000}
	e.judge = &recorder{name: "judge", spend: 50_000, verdicts: verdicts}
	e.st, e.client = startStack(t, stack.Config{Pipelines: relayPipeline(t, 20, maxRevisions), Agents: []agentrunner.Agent{e.draft, e.judge}, OperatorToken: opToken})
	e.input = mustInput(t, e.st)
	return e
}

func mustInput(t *testing.T, st *stack.Stack) *handoffv1.Artifact {
	t.Helper()
	a, err := st.Artifacts.Put(context.Background(), artifact.Ref{JobID: "tkt_1", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// op is the context of an operator's call on env.client, which already carries the
// operator's service identity; the operator token itself is tried on an anonymous client
// (TestResolveApproveWritesOnce) and by cmd/coordinator's tests.
func op() context.Context { return context.Background() }

func waitState(t *testing.T, e *env, runID string, want handoffv1.JobState) *handoffv1.Job {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := e.client.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: runID})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetJob().GetState() == want {
			return got.GetJob()
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s, want %s (escalation %v)", runID, got.GetJob().GetState(), want, got.GetJob().GetEscalation())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func events(t *testing.T, e *env, runID string) []string {
	t.Helper()
	evs, err := e.st.Store.Events(context.Background(), runID, 0)
	if err != nil {
		t.Fatal(err)
	}
	return kinds(evs)
}

func TestResolveApproveWritesOnce(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("state %s, want ESCALATED", job.GetState())
	}
	// No token, wrong token: no access.
	anon := anonymous(t, e.st)
	if _, err := anon.ListEscalations(context.Background(), &handoffv1.ListEscalationsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListEscalations without token: %v, want Unauthenticated", err)
	}
	bad := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer nope")
	approve := &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1, Comment: "fixed the citation",
		Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{ArtifactText: ptr("an edited note")}}}
	if _, err := anon.ResolveEscalation(bad, approve); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ResolveEscalation with a wrong token: %v, want Unauthenticated", err)
	}
	withToken := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+opToken)
	list, err := anon.ListEscalations(withToken, &handoffv1.ListEscalationsRequest{})
	if err != nil || len(list.GetJobs()) != 1 || list.GetJobs()[0].GetRunId() != job.GetRunId() {
		t.Fatalf("ListEscalations: %v %v", list, err)
	}

	resp, err := e.client.ResolveEscalation(op(), approve)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetJob().GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || resp.GetReceipt() == nil || resp.GetDuplicate() {
		t.Fatalf("approve: %v", resp)
	}
	if k := resp.GetReceipt().GetIdempotencyKey(); k != "tkt_1:writeback:note" {
		t.Fatalf("idempotency key %q", k)
	}
	if ev := resp.GetJob().GetEvaluator(); ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS || ev.GetRounds() != 1 || len(ev.GetFailures()) != 0 {
		t.Fatalf("evaluator %v", ev)
	}
	if acc := resp.GetResolution().GetAccount(); acc != "operator (token)" {
		t.Fatalf("resolution account %q: want the verified caller, not the typed name", acc)
	}
	if a := resp.GetResolution().GetEditedArtifact(); a == nil || a.GetType() != "note" || a.GetProducedBy() != "operator" {
		t.Fatalf("edited artifact %v", a)
	}
	data, err := e.st.Artifacts.Get(context.Background(), resp.GetResolution().GetEditedArtifact().GetUri())
	if err != nil || string(data) != "an edited note" {
		t.Fatalf("edited artifact bytes %q %v", data, err)
	}
	if e.writes(t) != 1 {
		t.Fatalf("ledger has %d writes, want 1", e.writes(t))
	}
	// Approving again (also concurrently) writes nothing new: same key, first receipt.
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			r, err := e.client.ResolveEscalation(op(), approve)
			if err == nil && (!r.GetDuplicate() || r.GetReceipt().GetExternalId() != resp.GetReceipt().GetExternalId()) {
				err = fmt.Errorf("second approve: %v", r)
			}
			if status.Code(err) == codes.Aborted {
				err = nil // the other one held the run
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if e.writes(t) != 1 {
		t.Fatalf("ledger has %d writes after approving again, want 1", e.writes(t))
	}
	evs := events(t, e, job.GetRunId())
	if !slices.Contains(evs, "writeback:RESOLVED") || evs[len(evs)-1] != "writeback:COMPLETED" {
		t.Fatalf("timeline %v", evs)
	}
	// A completed run cannot be failed.
	_, err = e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "late"}}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("fail on a completed run: %v, want FailedPrecondition", err)
	}
}

func TestResolveReturnToStage(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS})
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("state %s, want ESCALATED", job.GetState())
	}
	ret := func(stage string) error {
		_, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1, Comment: "cite the policy",
			Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: stage, Grant: oneRevision}}})
		return err
	}
	if err := ret("nope"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown stage: %v, want InvalidArgument", err)
	}
	if err := ret("draft"); err != nil {
		t.Fatal(err)
	}
	done := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	if done.GetTraceparent() != job.GetTraceparent() || done.GetReceipt() == nil {
		t.Fatalf("completed run %v", done)
	}
	if e.draft.calls() != 3 || e.writes(t) != 1 {
		t.Fatalf("draft calls %d, writes %d; want 3, 1", e.draft.calls(), e.writes(t))
	}
	if hint := e.draft.got[2].GetNextHint(); hint != "operator: cite the policy" {
		t.Fatalf("next hint %q", hint)
	}
	if err := ret("draft"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("return on a completed run: %v, want FailedPrecondition", err)
	}
}

// TestResolveReturnBeforeAnyVerdict: a run escalated before any judge verdict (the judge's
// stage failed) and sent back to draft by a person runs draft again, with the person's
// edit, rather than being answered with draft's first result as a DUPLICATE; its artifact
// does not overwrite the first run's.
func TestResolveReturnBeforeAnyVerdict(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS})
	e.judge.failFirst = 1
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED || job.GetEvaluator() != nil {
		t.Fatalf("run %s (%v), evaluator %v; want ESCALATED STAGE_FAILED before any verdict", job.GetState(), job.GetEscalation(), job.GetEvaluator())
	}
	resp, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1, Comment: "start over",
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft", ArtifactText: ptr("an edited note")}}})
	if err != nil {
		t.Fatal(err)
	}
	done := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	if e.draft.calls() != 2 {
		t.Fatalf("draft ran %d times; want 2 (sent back by a person, it runs again)", e.draft.calls())
	}
	again := e.draft.got[1]
	if again.GetOperatorReturns() != 1 || done.GetOperatorReturns() != 1 {
		t.Fatalf("operator_returns: package %d, run %d; want 1", again.GetOperatorReturns(), done.GetOperatorReturns())
	}
	edited := resp.GetResolution().GetEditedArtifact()
	if edited == nil || !slices.ContainsFunc(again.GetArtifacts(), func(a *handoffv1.Artifact) bool { return a.GetUri() == edited.GetUri() }) {
		t.Fatalf("re-run package artifacts %v; want the edited one %v", again.GetArtifacts(), edited)
	}
	// Each draft run's note is its own file, both still readable.
	var notes []string
	for _, a := range done.GetArtifacts() {
		if a.GetProducedBy() == "draft" {
			notes = append(notes, a.GetUri())
			if _, err := e.st.Artifacts.Get(context.Background(), a.GetUri()); err != nil {
				t.Fatalf("draft artifact %s: %v", a.GetUri(), err)
			}
		}
	}
	if len(notes) != 2 || notes[0] == notes[1] {
		t.Fatalf("draft artifacts %v; want two distinct ones", notes)
	}
	if e.judge.calls() != 2 || e.writes(t) != 1 {
		t.Fatalf("judge calls %d, writes %d; want 2, 1", e.judge.calls(), e.writes(t))
	}
}

func TestResolveFailAndReject(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	for i, action := range []*handoffv1.ResolveEscalationRequest{
		{Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "customer withdrew"}}},
		{Action: &handoffv1.ResolveEscalationRequest_RejectMalformed{RejectMalformed: &handoffv1.RejectMalformedAction{Reason: "ticket is spam"}}},
	} {
		job, _ := e.submit(t, "relay", fmt.Sprintf("tkt_%d", i+1), "", e.defaultBudget)
		action.RunId, action.Operator, action.Escalation = job.GetRunId(), "bo", 1
		resp, err := e.client.ResolveEscalation(op(), action)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetJob().GetState() != handoffv1.JobState_JOB_STATE_FAILED {
			t.Fatalf("state %s", resp.GetJob().GetState())
		}
		evs := events(t, e, job.GetRunId())
		if evs[len(evs)-2] != "judge:RESOLVED" || evs[len(evs)-1] != "judge:FAILED" {
			t.Fatalf("timeline %v", evs)
		}
	}
	if e.writes(t) != 0 {
		t.Fatalf("writes %d", e.writes(t))
	}
	// Missing operator / action: invalid.
	_, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: "run_x"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty request: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// oneRevision is the grant a return from REVISIONS_EXHAUSTED needs.
var oneRevision = &handoffv1.Grant{Revisions: 1}

// TestResolveReturnCap: a run already sent back as often as the contract's operator_returns
// allows is refused another return (its packages would all be rejected), not broken.
func TestResolveReturnCap(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("state %s, want ESCALATED", job.GetState())
	}
	ctx := context.Background()
	run, err := e.st.Store.GetRun(ctx, job.GetRunId())
	if err != nil {
		t.Fatal(err)
	}
	run.OperatorReturns = 1000
	if err := e.st.Store.PutRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft", Grant: oneRevision}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "1000 times") {
		t.Fatalf("return past the cap = %v; want FailedPrecondition naming the count", err)
	}
	if got := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED); got.GetOperatorReturns() != 1000 {
		t.Fatalf("run after the refused return: operator_returns %d, want 1000 (unchanged)", got.GetOperatorReturns())
	}
}

// A decision names the escalation it answers: after a return to a stage the run escalates
// again (escalation 2), and a decision made for the first is refused, changing nothing.
func TestResolveStaleEscalationRefused(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetNumber() != 1 || job.GetEscalations() != 1 {
		t.Fatalf("run %s, escalation %v (count %d); want ESCALATED, number 1", job.GetState(), job.GetEscalation(), job.GetEscalations())
	}
	decide := func(n uint32, a *handoffv1.ResolveEscalationRequest) error {
		a.RunId, a.Operator, a.Escalation = job.GetRunId(), "ana", n
		_, err := e.client.ResolveEscalation(op(), a)
		return err
	}
	if err := decide(1, &handoffv1.ResolveEscalationRequest{Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft", Grant: oneRevision}}}); err != nil {
		t.Fatal(err)
	}
	again := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	for deadline := time.Now().Add(10 * time.Second); again.GetEscalation().GetNumber() != 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		again = waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	}
	if again.GetEscalation().GetNumber() != 2 || again.GetEscalations() != 2 {
		t.Fatalf("second escalation %v (count %d); want number 2", again.GetEscalation(), again.GetEscalations())
	}
	before := len(events(t, e, job.GetRunId()))
	err := decide(1, &handoffv1.ResolveEscalationRequest{Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "escalation 2") || !strings.Contains(err.Error(), "for escalation 1") {
		t.Fatalf("a decision for escalation 1 at escalation 2 = %v; want FailedPrecondition naming both", err)
	}
	if n := len(events(t, e, job.GetRunId())); n != before || e.writes(t) != 0 {
		t.Fatalf("the refused decision wrote %d events and %d writes", n-before, e.writes(t))
	}
	if err := decide(2, &handoffv1.ResolveEscalationRequest{Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "enough"}}}); err != nil {
		t.Fatalf("the decision for escalation 2: %v", err)
	}
}

// A long non-ASCII comment becomes the next hint cut on a rune boundary: the run saves
// and goes on, and the hint is valid UTF-8.
func TestResolveReturnCommentCutOnARune(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS})
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	comment := "x" + strings.Repeat("é", 600) // "operator: x" + 2-byte runes: byte 1000 falls inside one
	_, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1, Comment: comment,
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft", Grant: oneRevision}}})
	if err != nil {
		t.Fatalf("return with a long non-ASCII comment: %v", err)
	}
	waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	hint := e.draft.got[len(e.draft.got)-1].GetNextHint()
	if !utf8.ValidString(hint) || len(hint) > 1000 || len(hint) < 998 || !strings.HasPrefix(hint, "operator: x") {
		t.Fatalf("next hint: %d bytes, valid UTF-8 %v; want the comment cut to at most 1000 bytes on a rune", len(hint), utf8.ValidString(hint))
	}
}

// An approve with nothing to write is refused before anything is recorded: a run escalated
// at draft holds no note.v1 (the writeback stage's input), so approving it could only
// re-escalate WRITE_REFUSED after claiming a human PASS.
func TestApproveWithoutWritebackInputRefused(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS})
	e.draft.failFirst = 1
	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetStage() != "draft" {
		t.Fatalf("run %s at %s (%v); want ESCALATED at draft", job.GetState(), job.GetStage(), job.GetEscalation())
	}
	before := events(t, e, job.GetRunId())
	_, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "no note.v1 artifact") {
		t.Fatalf("approve without a note = %v; want FailedPrecondition naming note.v1", err)
	}
	got := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	if got.GetResolution() != nil || got.GetEvaluator() != nil || got.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED {
		t.Fatalf("after the refused approve: resolution %v evaluator %v escalation %v; want none recorded, cause unchanged", got.GetResolution(), got.GetEvaluator(), got.GetEscalation())
	}
	if after := events(t, e, job.GetRunId()); !slices.Equal(before, after) {
		t.Fatalf("timeline changed by a refused approve:\n%v\n%v", before, after)
	}
	if e.writes(t) != 0 {
		t.Fatalf("writes %d, want 0", e.writes(t))
	}
}

// Nothing a decision did not change is erased: a fail keeps the cause and route of the
// escalation it decided; an approve's human PASS does not count as a judge round and the
// judge's "revise" hint no longer stands; a return counts no round either.
func TestDecisionsEraseNothing(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	e.judge.hint = "revise: cite claim 2"
	ctx := context.Background()

	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	esc := job.GetEscalation()
	if esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED || esc.GetRoute() == "" || job.GetNextHint() != e.judge.hint {
		t.Fatalf("escalation %v hint %q; want REVISIONS_EXHAUSTED with a route and the judge's hint", esc, job.GetNextHint())
	}
	resp, err := e.client.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "customer withdrew"}}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetJob()
	if got.GetState() != handoffv1.JobState_JOB_STATE_FAILED || got.GetEscalation().GetCause() != esc.GetCause() || got.GetEscalation().GetRoute() != esc.GetRoute() ||
		got.GetResolution().GetReason() != "customer withdrew" {
		t.Fatalf("after fail: %s escalation %v resolution %v; want FAILED keeping cause %s and route %q beside the reason", got.GetState(), got.GetEscalation(), got.GetResolution(), esc.GetCause(), esc.GetRoute())
	}

	job, _ = e.submit(t, "relay", "tkt_2", "", e.defaultBudget)
	resp, err = e.client.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{}}})
	if err != nil {
		t.Fatal(err)
	}
	got = resp.GetJob()
	if got.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || got.GetEvaluator().GetRounds() != 1 || got.GetNextHint() != "" {
		t.Fatalf("after approve: %s rounds %d hint %q; want COMPLETED, 1 judge round, no revise hint", got.GetState(), got.GetEvaluator().GetRounds(), got.GetNextHint())
	}

	job, _ = e.submit(t, "relay", "tkt_3", "", e.defaultBudget)
	if _, err := e.client.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "judge", Grant: oneRevision}}}); err != nil {
		t.Fatal(err)
	}
	// With the revision granted the judge fails it again, the draft revises, the judge fails
	// it a third time and the run escalates again: three verdicts, three rounds.
	again := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	for again.GetEscalation().GetNumber() < 2 {
		time.Sleep(50 * time.Millisecond)
		again = waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	}
	verdicts := 0
	for _, k := range events(t, e, job.GetRunId()) {
		if strings.HasPrefix(k, "judge:VERDICT") {
			verdicts++
		}
	}
	if verdicts != 3 || again.GetEvaluator().GetRounds() != 3 {
		t.Fatalf("after a return: rounds %d, judge verdicts on the timeline %d; want both 3", again.GetEvaluator().GetRounds(), verdicts)
	}
}

// A return from HOP_CAP gives the run what it lacked: without a grant of hops it is refused
// with the reason, past the pipeline's escalation.max_grant it is refused naming the limit,
// and with 4 hops it completes, the grant recorded in the RESOLVED event with the account.
func TestReturnWithGrant(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS})
	ctx := context.Background()
	job, _ := e.submit(t, "relay", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 2})
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP {
		t.Fatalf("run %s (%v); want ESCALATED HOP_CAP", job.GetState(), job.GetEscalation())
	}
	ret := func(g *handoffv1.Grant) (*handoffv1.ResolveEscalationResponse, error) {
		return e.client.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
			Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "writeback", Grant: g}}})
	}
	before := events(t, e, job.GetRunId())
	if _, err := ret(nil); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "no hops left") || !strings.Contains(status.Convert(err).Message(), "grant hops") {
		t.Fatalf("return from HOP_CAP without a grant = %v; want FailedPrecondition saying no hops are left and to grant hops", err)
	}
	if _, err := ret(&handoffv1.Grant{Hops: 9}); status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "at most 8 (escalation.max_grant.hops)") {
		t.Fatalf("grant past max_grant = %v; want InvalidArgument naming the limit", err)
	}
	if w, err := e.st.Store.Wallet(ctx, job.GetRunId()); err != nil || w.GetHopsRemaining() != 0 {
		t.Fatalf("wallet after refused returns: %v %v; want still 0 hops", w, err)
	}
	if after := events(t, e, job.GetRunId()); !slices.Equal(before, after) {
		t.Fatalf("refused returns changed the timeline:\n%v\n%v", before, after)
	}
	resp, err := ret(&handoffv1.Grant{Hops: 4})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.GetResolution().GetGrant(); g.GetHops() != 4 {
		t.Fatalf("resolution grant %v, want 4 hops", g)
	}
	done := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	if done.GetWallet().GetHopsRemaining() != 3 || e.writes(t) != 1 {
		t.Fatalf("after the grant: %d hops left, %d writes; want 3 (4 granted, 1 used by the writeback), 1", done.GetWallet().GetHopsRemaining(), e.writes(t))
	}
	evs, err := e.st.Store.Events(ctx, job.GetRunId(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var got *handoffv1.Resolution
	for _, ev := range evs {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_RESOLVED {
			got = ev.GetResolution()
		}
	}
	if got.GetGrant().GetHops() != 4 || got.GetAccount() != "operator (token)" {
		t.Fatalf("RESOLVED event resolution %v; want the 4-hop grant and who gave it", got)
	}
}

// A return from an empty wallet needs money; a return from a cause nothing ran out for
// needs no grant.
func TestReturnFromEmptyWalletNeedsMoney(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS})
	job, _ := e.submit(t, "relay", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 60_000})
	if job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY {
		t.Fatalf("escalation %v; want WALLET_EMPTY", job.GetEscalation())
	}
	req := &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "judge", Grant: &handoffv1.Grant{Hops: 1}}}}
	if _, err := e.client.ResolveEscalation(context.Background(), req); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "grant usd_micros") {
		t.Fatalf("return from WALLET_EMPTY granting only hops = %v; want FailedPrecondition asking for money", err)
	}
	req.GetReturnToStage().Grant = &handoffv1.Grant{UsdMicros: 500_000}
	if _, err := e.client.ResolveEscalation(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	done := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	if done.GetWallet().GetUsdRemainingMicros() != 450_000 {
		t.Fatalf("wallet after a $0.50 grant and the judge's $0.05: %d micros, want 450000", done.GetWallet().GetUsdRemainingMicros())
	}
}

// TestHopTimeline: GetJob answers the run's hops in order, each with its stage, ack, the
// move after it, spend, verdict and duration; the decision of a person is on it with its
// account and grant, and the hop that ended the run says how.
func TestHopTimeline(t *testing.T) {
	e := startOp(t, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS})
	ctx := context.Background()
	job, _ := e.submit(t, "relay", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 2})
	if _, err := e.client.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "writeback", Grant: &handoffv1.Grant{Hops: 4}}}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
	resp, err := e.client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range resp.GetTimeline() {
		line := fmt.Sprintf("%d %s", r.GetHop(), r.GetStage())
		if r.GetAck() != handoffv1.AckStatus_ACK_STATUS_UNSPECIFIED {
			line += " " + strings.TrimPrefix(r.GetAck().String(), "ACK_STATUS_")
		}
		if r.GetSpentUsdMicros() > 0 {
			line += fmt.Sprintf(" $%d", r.GetSpentUsdMicros())
		}
		if r.GetVerdict() != handoffv1.Verdict_VERDICT_UNSPECIFIED {
			line += " " + strings.TrimPrefix(r.GetVerdict().String(), "VERDICT_")
		}
		if tr := r.GetTransfer(); tr != nil {
			line += " ->" + tr.GetToStage()
		}
		if r.GetReceipt() != nil {
			line += " receipt"
		}
		if res := r.GetResolution(); res != nil {
			line += fmt.Sprintf(" %s by %s grant %d hops", strings.TrimPrefix(res.GetAction().String(), "RESOLUTION_ACTION_"), res.GetAccount(), res.GetGrant().GetHops())
		}
		if r.GetEnd() != handoffv1.EventKind_EVENT_KIND_UNSPECIFIED {
			line += " " + strings.TrimPrefix(r.GetEnd().String(), "EVENT_KIND_")
			if c := r.GetEscalation().GetCause(); c != handoffv1.EscalationCause_ESCALATION_CAUSE_UNSPECIFIED {
				line += ":" + strings.TrimPrefix(c.String(), "ESCALATION_CAUSE_")
			}
		}
		if r.GetAck() != handoffv1.AckStatus_ACK_STATUS_UNSPECIFIED && r.GetDuration() == nil {
			t.Errorf("hop %d %s has no duration", r.GetHop(), r.GetStage())
		}
		got = append(got, line)
	}
	want := []string{
		"1 draft ACCEPTED $100000 ->judge",
		"2 judge ACCEPTED $50000 PASS ->writeback ESCALATED:HOP_CAP",
		"2 writeback ->writeback RETURN_TO_STAGE by operator (token) grant 4 hops",
		"3 writeback ACCEPTED ->end receipt COMPLETED",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("timeline:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// One owner per escalation: a claim shows who holds it, another operator can neither claim
// nor decide it while it lasts unless they override (recorded), and a claim that expired or
// was released is free.
func TestEscalationClaim(t *testing.T) {
	e := startOp(t, 0, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL})
	ctx := context.Background()
	other := anonymous(t, e.st)
	bo := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+opToken) // account "operator"
	const ana = "operator (token)"                                                  // e.client's account
	claim := func(c handoffv1.CoordinatorServiceClient, cctx context.Context, runID string, release bool) (*handoffv1.Claim, error) {
		r, err := c.ClaimEscalation(cctx, &handoffv1.ClaimEscalationRequest{RunId: runID, Escalation: 1, Release: release})
		return r.GetClaim(), err
	}
	fail := &handoffv1.ResolveEscalationRequest{Operator: "bo", Escalation: 1, Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "spam"}}}

	job, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	c, err := claim(e.client, ctx, job.GetRunId(), false)
	if err != nil || c.GetAccount() != ana || !c.GetExpiresAt().AsTime().After(time.Now().Add(10*time.Minute)) {
		t.Fatalf("claim = %v, %v; want it held by %s for the claim TTL", c, err, ana)
	}
	if got := waitState(t, e, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED); got.GetClaim().GetAccount() != ana {
		t.Fatalf("GetJob claim %v; the others must see who holds it", got.GetClaim())
	}
	if _, err := claim(other, bo, job.GetRunId(), false); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "claimed by "+ana) {
		t.Fatalf("second claim = %v; want FailedPrecondition naming the holder", err)
	}
	fail.RunId = job.GetRunId()
	if _, err := other.ResolveEscalation(bo, fail); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "only the holder decides") {
		t.Fatalf("decision by another operator = %v; want FailedPrecondition", err)
	}
	fail.Override = true
	resp, err := other.ResolveEscalation(bo, fail)
	if err != nil {
		t.Fatal(err)
	}
	if res := resp.GetResolution(); res.GetOverrode() != ana || res.GetAccount() != "operator" || resp.GetJob().GetClaim() != nil {
		t.Fatalf("override: resolution %v, claim %v; want the override of %s recorded and the claim gone", res, resp.GetJob().GetClaim(), ana)
	}

	// An expired claim is free; a released one too.
	job, _ = e.submit(t, "relay", "tkt_2", "", e.defaultBudget)
	if _, err := claim(e.client, ctx, job.GetRunId(), false); err != nil {
		t.Fatal(err)
	}
	run, err := e.st.Store.GetRun(ctx, job.GetRunId())
	if err != nil {
		t.Fatal(err)
	}
	run.Claim.ExpiresAt = timestamppb.New(time.Now().Add(-time.Second))
	if err := e.st.Store.PutRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	if c, err := claim(other, bo, job.GetRunId(), false); err != nil || c.GetAccount() != "operator" {
		t.Fatalf("claim of an expired claim = %v, %v", c, err)
	}
	if _, err := claim(other, bo, job.GetRunId(), true); err != nil {
		t.Fatal(err)
	}
	if c, err := claim(e.client, ctx, job.GetRunId(), false); err != nil || c.GetAccount() != ana {
		t.Fatalf("claim after a release = %v, %v", c, err)
	}
	fail.RunId, fail.Override = job.GetRunId(), false
	if resp, err := e.client.ResolveEscalation(ctx, fail); err != nil || resp.GetResolution().GetOverrode() != "" {
		t.Fatalf("the holder's decision = %v, %v; want it taken, no override", resp.GetResolution(), err)
	}
}
