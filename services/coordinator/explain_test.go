package coordinator_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/coordinator"
)

// violationKinds lists the kinds of an explanation's violations with their hops' stages.
func violationKinds(ex *handoffv1.Explanation) []string {
	var out []string
	for _, v := range ex.GetViolations() {
		out = append(out, v.GetStage()+":"+v.GetKind().String())
	}
	return out
}

func explainRun(t *testing.T, e *env, runID string) *handoffv1.Explanation {
	t.Helper()
	resp, err := e.client.ExplainJob(context.Background(), &handoffv1.ExplainJobRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetExplanation()
}

// A run the receiver refused for a silent reset is explained as one, at the hop refused;
// an identical revision as a stale plan. Each hop has its five answers.
func TestExplainFlagsResetAndStalePlan(t *testing.T) {
	t.Run("silent reset", func(t *testing.T) {
		tamper := func(p *handoffv1.HandoffPackage) {
			if p.GetStage() == "draft" && p.GetEvaluator().GetLastVerdict() == handoffv1.Verdict_VERDICT_FAIL {
				p.Evaluator = nil
			}
		}
		e := startCarry(t, nil, "revise", &recorder{name: "intake"}, &recorder{name: "draft"}, &recorder{name: "judge", verdicts: failThenPass()}, tamper)
		job, _ := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
		ex := explainRun(t, e.env, job.GetRunId())
		if len(ex.GetHops()) != 4 {
			t.Fatalf("%d hops explained, want 4", len(ex.GetHops()))
		}
		for _, h := range ex.GetHops() {
			if len(h.GetAnswers()) != 5 {
				t.Errorf("hop %d: %d answers", h.GetHop(), len(h.GetAnswers()))
			}
		}
		last := ex.GetHops()[3]
		if a := last.GetAnswers()[2]; a.GetFinding() != handoffv1.Finding_FINDING_VIOLATION || a.GetEvidence()[0].GetField() != "evaluator.last_verdict" {
			t.Errorf("hop 4 evaluator answer %v", a)
		}
		if a := last.GetAnswers()[1]; a.GetFinding() != handoffv1.Finding_FINDING_VIOLATION || a.GetEvidence()[0].GetField() != "evaluator.last_verdict" {
			t.Errorf("hop 4 required-field answer %v; want the ack's reason", a)
		}
		testkit.Equal(t, violationKinds(ex), []string{"draft:VIOLATION_KIND_SILENT_RESET"}, "violations")
	})
	t.Run("stale plan", func(t *testing.T) {
		e := startCarry(t, nil, "escalate", &recorder{name: "intake"}, &recorder{name: "draft", same: 2}, &recorder{name: "judge", verdicts: failThenPass()}, nil)
		job, _ := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
		testkit.Equal(t, violationKinds(explainRun(t, e.env, job.GetRunId())), []string{"draft:VIOLATION_KIND_STALE_PLAN"}, "violations")
	})
	t.Run("honest run", func(t *testing.T) {
		e := startCarry(t, nil, "revise", &recorder{name: "intake"}, &recorder{name: "draft"}, &recorder{name: "judge", verdicts: failThenPass()}, nil)
		job, _ := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
		if v := violationKinds(explainRun(t, e.env, job.GetRunId())); len(v) != 0 {
			t.Errorf("violations %v in an honest run", v)
		}
	})
}

// Explain is pure: a tool burned by an earlier stage and called again, and a goal that is
// not the run's, are flagged from the events alone, naming the tool and the field, never
// their values.
func TestExplainBurnedToolAndGoalChanged(t *testing.T) {
	job := &handoffv1.Job{RunId: "run_1", JobId: "tkt_1", Goal: "the goal", Constraints: []string{"c1"}}
	pkg := &handoffv1.HandoffPackage{JobId: "tkt_1", Stage: "draft", Goal: "a wider goal", Constraints: []string{"c1"},
		ToolsTried: []*handoffv1.ToolAttempt{{Name: "kb.search", Ok: false, ErrorCode: "http_503", Stage: "retrieve"}}}
	evs := []*handoffv1.JobEvent{
		{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: "draft", Hop: 1, Package: pkg},
		{Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: "draft", Hop: 1, Ack: &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED, JobId: "tkt_1"}},
		{Kind: handoffv1.EventKind_EVENT_KIND_STAGE_RESULT, Stage: "draft", Hop: 1, Result: &handoffv1.StageResult{JobId: "tkt_1",
			ToolsTried: []*handoffv1.ToolAttempt{{Name: "kb.search", Ok: true}}}},
	}
	ex := coordinator.Explain(job, evs)
	testkit.Equal(t, violationKinds(ex), []string{"draft:VIOLATION_KIND_BURNED_TOOL_RETRIED", "draft:VIOLATION_KIND_GOAL_CHANGED"}, "violations")
	burned := ex.GetViolations()[0].GetEvidence()[0]
	if burned.GetNote() != "kb.search" || burned.GetStage() != "retrieve" || burned.GetField() != "result.tools_tried[0]" {
		t.Errorf("burned tool evidence %v", burned)
	}
	for _, v := range ex.GetViolations() {
		for _, e := range v.GetEvidence() {
			if e.GetNote() == "a wider goal" || e.GetNote() == "the goal" {
				t.Errorf("evidence shows the goal: %v", e)
			}
		}
	}
	// A package not kept (an older event) is UNKNOWN, not OK.
	evs[0].Package = nil
	if a := coordinator.Explain(job, evs).GetHops()[0].GetAnswers()[0]; a.GetFinding() != handoffv1.Finding_FINDING_UNKNOWN {
		t.Errorf("same job_id without the package = %v, want UNKNOWN", a.GetFinding())
	}
}

// ExplainJob: a run id that is not one is InvalidArgument, an unknown run NotFound, and a
// caller without an identity is refused before either.
func TestExplainJobRefuses(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		client handoffv1.CoordinatorServiceClient
		runID  string
		code   codes.Code
	}{
		{"empty run id", e.client, "", codes.InvalidArgument},
		{"bad run id", e.client, "run id with spaces", codes.InvalidArgument},
		{"unknown run", e.client, "run_0123456789abcdef", codes.NotFound},
		{"caller without identity", anonymous(t, e.st), "run_0123456789abcdef", codes.Unauthenticated},
	} {
		_, err := tc.client.ExplainJob(ctx, &handoffv1.ExplainJobRequest{RunId: tc.runID})
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.code)
		}
	}
}
