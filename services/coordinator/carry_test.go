package coordinator_test

// Context is carried, not overwritten (issue 19): open questions accumulate, memory refs
// are added as refs, tracestate travels, and each PACKAGE_SENT keeps the package sent.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// carryPipeline: intake, draft, judge (revise draft), writeback; scripted agents.
const carryPipeline = `
name: carry
max_hops: 12
max_revisions: 2
stale_revision: %s
escalation: {route: humans}
tools:
  - {name: crm.patch, access: write, system: crm}
stages:
  - name: intake
    input: raw_ticket.v1
    output: {type: brief, schema_version: brief.v1}
    criteria: [briefed]
  - name: draft
    input: brief.v1
    output: {type: note, schema_version: note.v1}
    criteria: [drafted]
  - name: judge
    kind: judge
    revise: draft
    input: note.v1
    output: {type: verdict, schema_version: verdict.v1}
    criteria: [judged]
  - name: writeback
    kind: writeback
    input: note.v1
    writer: {system: crm, target: ledger}
    tools: [crm.patch]
    output: {type: crm_receipt, schema_version: crm_receipt.v1}
    criteria: [written]
`

type carryEnv struct {
	*env
	intake *recorder
}

// startCarry runs the carry pipeline on s (nil: the embedded store) with scripted agents
// the caller configures through the returned recorders before submitting.
func startCarry(t *testing.T, s store.Store, stale string, intake, draft, judge *recorder, tamper func(*handoffv1.HandoffPackage)) *carryEnv {
	t.Helper()
	p, problems, err := pipeline.Parse("carry.yaml", []byte(fmt.Sprintf(carryPipeline, stale)))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("carry pipeline: %v %v", err, problems)
	}
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, draft: draft, judge: judge}
	e.st, e.client = startStack(t, stack.Config{Store: s, Tamper: tamper, Pipelines: map[string]*pipeline.Pipeline{p.Name: p},
		Agents: []agentrunner.Agent{intake, draft, judge}})
	e.input = mustInput(t, e.st)
	return &carryEnv{env: e, intake: intake}
}

func pass() []handoffv1.Verdict { return []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS} }

func failThenPass() []handoffv1.Verdict {
	return []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}
}

// Intake's open question is still open at the judge: draft neither repeats nor resolves
// it. Draft resolves intake's other question by name, and only that one goes; its own new
// question is added.
func TestOpenQuestionReachesJudge(t *testing.T) {
	intake := &recorder{name: "intake", questions: []string{"customer timezone unknown", "order id missing"}}
	draft := &recorder{name: "draft", questions: []string{"refund window unclear"}, resolved: []string{"order id missing", "never asked"}}
	judge := &recorder{name: "judge", verdicts: pass()}
	e := startCarry(t, nil, "revise", intake, draft, judge, nil)
	job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job %s: %v; %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	testkit.Equal(t, draft.got[0].GetOpenQuestions(), []string{"customer timezone unknown", "order id missing"}, "draft's open questions")
	testkit.Equal(t, judge.got[0].GetOpenQuestions(), []string{"customer timezone unknown", "refund window unclear"}, "judge's open questions")
}

// A stage's memory refs are added to the job's and reach the next stage after the ones
// submitted; a free-text "ref" is an invalid result, named by its field, and nothing of it
// enters the run.
func TestStageMemoryRefs(t *testing.T) {
	t.Run("refs are carried", func(t *testing.T) {
		intake := &recorder{name: "intake", refs: []string{"order_id:ord_1", "customer_id:cus_9"}}
		judge := &recorder{name: "judge", verdicts: pass()}
		e := startCarry(t, nil, "revise", intake, &recorder{name: "draft"}, judge, nil)
		job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("job %s: %v; %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}
		testkit.Equal(t, judge.got[0].GetMemoryRefs(), []string{"customer_id:cus_9", "order_id:ord_1"}, "judge's memory refs")
		testkit.Equal(t, job.GetMemoryRefs(), []string{"customer_id:cus_9"}, "the job's submitted refs stay as submitted")
	})
	t.Run("free text is refused", func(t *testing.T) {
		intake := &recorder{name: "intake", refs: []string{"the customer sounded upset on the phone"}}
		draft := &recorder{name: "draft"}
		e := startCarry(t, nil, "revise", intake, draft, &recorder{name: "judge", verdicts: pass()}, nil)
		job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
		if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED {
			t.Fatalf("job %s %v; want ESCALATED STAGE_FAILED; %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}
		if draft.calls() != 0 {
			t.Errorf("draft ran %d times after intake's invalid result", draft.calls())
		}
		// The runner refuses the result it validates (a FAILED result naming the field).
		if !containsField(job, "memory_refs[0]") {
			t.Errorf("escalation %v does not name memory_refs[0]", job.GetEscalation())
		}
	})
}

func containsField(job *handoffv1.Job, field string) bool {
	esc := job.GetEscalation()
	for _, r := range esc.GetReasons() {
		if r.GetField() == field {
			return true
		}
	}
	return strings.Contains(esc.GetDetail(), field)
}

// A tracestate given at submit is on every package (every agent hop and the writeback's)
// and on the receipt; each PACKAGE_SENT event keeps exactly the package its stage got.
func TestTracestateEveryHopAndReceipt(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		intake, draft, judge := &recorder{name: "intake"}, &recorder{name: "draft"}, &recorder{name: "judge", verdicts: failThenPass()}
		e := startCarry(t, s, "revise", intake, draft, judge, nil)
		const tp, ts = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor1=opaque1,vendor2=opaque2"
		req := e.request("carry", "tkt_1", "", e.defaultBudget)
		req.Trace = &handoffv1.Trace{Traceparent: tp, Tracestate: ts}
		resp, err := e.client.SubmitJob(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := demo.Watch(context.Background(), e.client, resp.GetJob().GetRunId(), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.client.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		if err != nil {
			t.Fatal(err)
		}
		job := got.GetJob()
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("job %s: %v; %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}
		var agents []*handoffv1.HandoffPackage
		for _, r := range []*recorder{intake, draft, judge} {
			agents = append(agents, r.got...)
		}
		if len(agents) != 5 {
			t.Fatalf("%d agent calls, want 5 (intake, draft, judge FAIL, draft, judge PASS)", len(agents))
		}
		for _, p := range agents {
			if p.GetTrace().GetTracestate() != ts {
				t.Errorf("%s's package tracestate %q, want %q", p.GetStage(), p.GetTrace().GetTracestate(), ts)
			}
		}
		if job.GetReceipt().GetTracestate() != ts {
			t.Errorf("receipt tracestate %q, want %q", job.GetReceipt().GetTracestate(), ts)
		}
		// Every PACKAGE_SENT keeps its package: the agents' in the order they ran, then the
		// writeback's.
		var sent []*handoffv1.HandoffPackage
		for _, ev := range evs {
			if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT {
				if ev.GetPackage() == nil {
					t.Fatalf("PACKAGE_SENT to %s (hop %d) holds no package", ev.GetStage(), ev.GetHop())
				}
				sent = append(sent, ev.GetPackage())
			}
		}
		if len(sent) != 6 {
			t.Fatalf("%d packages sent, want 6", len(sent))
		}
		order := []*handoffv1.HandoffPackage{intake.got[0], draft.got[0], judge.got[0], draft.got[1], judge.got[1]}
		for i, want := range order {
			testkit.Equal(t, sent[i], want, fmt.Sprintf("package of hop %d as stored", i+1))
		}
		if wb := sent[5]; wb.GetStage() != "writeback" || wb.GetTrace().GetTracestate() != ts || wb.GetEvaluator().GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS {
			t.Errorf("writeback package %v", wb)
		}
	})
}

// After a judge's FAIL, a package for the job whose evaluator block was removed, or which
// claims a PASS no judge gave, is REJECTED_SCHEMA naming evaluator.last_verdict, with no
// agent call: the receiver checks the job's recorded verdicts in the hop's admission.
func TestSilentResetRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(*handoffv1.Evaluator) *handoffv1.Evaluator
	}{
		{"evaluator removed", func(*handoffv1.Evaluator) *handoffv1.Evaluator { return nil }},
		{"PASS no judge gave", func(ev *handoffv1.Evaluator) *handoffv1.Evaluator {
			return &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: ev.GetRounds()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, s store.Store) {
				tamper := func(p *handoffv1.HandoffPackage) {
					if p.GetStage() == "draft" && p.GetEvaluator().GetLastVerdict() == handoffv1.Verdict_VERDICT_FAIL {
						p.Evaluator = tc.tamper(p.GetEvaluator())
					}
				}
				intake, draft, judge := &recorder{name: "intake"}, &recorder{name: "draft"}, &recorder{name: "judge", verdicts: failThenPass()}
				e := startCarry(t, s, "revise", intake, draft, judge, tamper)
				job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
				if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA {
					t.Fatalf("job %s %v; want ESCALATED REJECTED_SCHEMA; %v", job.GetState(), job.GetEscalation(), kinds(evs))
				}
				rs := job.GetEscalation().GetReasons()
				if len(rs) != 1 || rs[0].GetField() != "evaluator.last_verdict" {
					t.Errorf("reasons %v; want one naming evaluator.last_verdict", rs)
				}
				// Draft ran once (the first draft), judge once (the FAIL): the reset package
				// cost no agent call.
				if draft.calls() != 1 || judge.calls() != 1 || e.writes(t) != 0 {
					t.Errorf("draft %d, judge %d calls, %d writes; want 1, 1, 0", draft.calls(), judge.calls(), e.writes(t))
				}
				want := []string{"intake:SUBMITTED", "intake:PACKAGE_SENT", "intake:ACK:ACCEPTED", "intake:STAGE_RESULT",
					"draft:PACKAGE_SENT", "draft:ACK:ACCEPTED", "draft:STAGE_RESULT", "judge:PACKAGE_SENT", "judge:ACK:ACCEPTED",
					"judge:STAGE_RESULT", "judge:VERDICT:FAIL", "draft:PACKAGE_SENT", "draft:ACK:REJECTED_SCHEMA", "draft:ESCALATED:REJECTED_SCHEMA"}
				testkit.Equal(t, kinds(evs), want, "timeline")
				// Check answers what Deliver did: the refused package, as its PACKAGE_SENT
				// kept it, is REJECTED_SCHEMA naming evaluator.last_verdict, and costs nothing.
				var refused *handoffv1.HandoffPackage
				for _, ev := range evs {
					if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT {
						refused = ev.GetPackage()
					}
				}
				cc, err := e.st.DialAs(e.st.RunnerAddr, "coordinator")
				if err != nil {
					t.Fatal(err)
				}
				resp, err := handoffv1.NewAgentRunnerServiceClient(cc).Check(context.Background(), &handoffv1.CheckRequest{Package: refused})
				if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || resp.GetAck().GetReasons()[0].GetField() != "evaluator.last_verdict" {
					t.Errorf("Check of the refused package = %v, %v; want REJECTED_SCHEMA naming evaluator.last_verdict", resp.GetAck(), err)
				}
				if draft.calls() != 1 {
					t.Errorf("Check ran the agent: %d draft calls", draft.calls())
				}
			})
		})
	}
}

// An honest run is never refused: the revision carries the FAIL, and the PASS after it is
// one the judge gave.
func TestCarriedVerdictIsAdmitted(t *testing.T) {
	intake, draft, judge := &recorder{name: "intake"}, &recorder{name: "draft"}, &recorder{name: "judge", verdicts: failThenPass()}
	e := startCarry(t, nil, "revise", intake, draft, judge, nil)
	job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job %s: %v; %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	// The FAIL is carried on the revision's package: it ran.
	if ev := draft.got[1].GetEvaluator(); ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_FAIL {
		t.Errorf("revision package evaluator %v", ev)
	}
	if slices.ContainsFunc(evs, func(ev *handoffv1.JobEvent) bool {
		return ev.GetAck().GetStatus() == handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA
	}) {
		t.Errorf("an honest run got a REJECTED_SCHEMA: %v", kinds(evs))
	}
}

// A revision byte-identical to the draft the judge rejected never reaches the judge. By
// default it goes back to the reviser once with the failure "revision identical to the
// rejected draft"; identical again, the run escalates STALE_PLAN. With stale_revision:
// escalate it escalates at once. A reviser that changes the draft after the send-back goes
// to the judge as usual.
func TestIdenticalRevisionNeverReachesJudge(t *testing.T) {
	for _, tc := range []struct {
		name        string
		policy      string
		same        int // draft calls writing the same bytes
		draftCalls  int
		judgeCalls  int
		wantState   handoffv1.JobState
		wantCause   handoffv1.EscalationCause
		sentBackMsg bool
	}{
		{"revise: identical twice escalates", "revise", 3, 3, 1, handoffv1.JobState_JOB_STATE_ESCALATED, handoffv1.EscalationCause_ESCALATION_CAUSE_STALE_PLAN, true},
		{"revise: changed after the send-back is judged", "revise", 2, 3, 2, handoffv1.JobState_JOB_STATE_COMPLETED, handoffv1.EscalationCause_ESCALATION_CAUSE_UNSPECIFIED, true},
		{"escalate at once", "escalate", 3, 2, 1, handoffv1.JobState_JOB_STATE_ESCALATED, handoffv1.EscalationCause_ESCALATION_CAUSE_STALE_PLAN, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			draft := &recorder{name: "draft", same: tc.same}
			judge := &recorder{name: "judge", verdicts: failThenPass()}
			e := startCarry(t, nil, tc.policy, &recorder{name: "intake"}, draft, judge, nil)
			job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
			if job.GetState() != tc.wantState || job.GetEscalation().GetCause() != tc.wantCause {
				t.Fatalf("job %s %v; want %s %s; %v", job.GetState(), job.GetEscalation(), tc.wantState, tc.wantCause, kinds(evs))
			}
			if draft.calls() != tc.draftCalls || judge.calls() != tc.judgeCalls {
				t.Errorf("draft %d, judge %d calls; want %d, %d", draft.calls(), judge.calls(), tc.draftCalls, tc.judgeCalls)
			}
			// The judge never got the identical revision: every note it judged differs from
			// the one before it.
			seen := map[string]bool{}
			for _, p := range judge.got {
				latest := p.GetArtifacts()[len(p.GetArtifacts())-1].GetSha256()
				if seen[latest] {
					t.Errorf("the judge got draft %s twice", latest)
				}
				seen[latest] = true
			}
			if tc.sentBackMsg {
				back := draft.got[2]
				if back.GetOrigin().GetMove() != handoffv1.Move_MOVE_STALE_REVISION || back.GetEvaluator().GetLastVerdict() != handoffv1.Verdict_VERDICT_FAIL ||
					!slices.ContainsFunc(back.GetEvaluator().GetFailures(), func(f *handoffv1.Failure) bool {
						return f.GetDetail() == "revision identical to the rejected draft"
					}) {
					t.Errorf("send-back package origin %v evaluator %v", back.GetOrigin(), back.GetEvaluator())
				}
				// No revision is taken for a send-back: no judge ran.
				if back.GetBudget().GetRevisionsRemaining() != draft.got[1].GetBudget().GetRevisionsRemaining() {
					t.Errorf("send-back took a revision: %d then %d", draft.got[1].GetBudget().GetRevisionsRemaining(), back.GetBudget().GetRevisionsRemaining())
				}
			}
			if tc.wantCause == handoffv1.EscalationCause_ESCALATION_CAUSE_STALE_PLAN {
				if rs := job.GetEscalation().GetReasons(); len(rs) != 1 || rs[0].GetRule() != "stale_plan" {
					t.Errorf("reasons %v; want one stale_plan", rs)
				}
			}
		})
	}
}
