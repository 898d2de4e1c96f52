package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// When the desk is full intake sheds load: with max_open_escalations 1 and one run waiting
// for a person, SubmitJob answers RESOURCE_EXHAUSTED with a RetryInfo delay and creates
// nothing; the queue depth is a metric; once the person decides, intake takes jobs again.
func TestDeskFullShedsIntake(t *testing.T) {
	src := strings.Replace(fmt.Sprintf(relay, 20, 0), "escalation: {route: humans, ", "escalation: {route: humans, max_open_escalations: 1, ", 1)
	p, problems, err := pipeline.Parse("relay.yaml", []byte(src))
	if err != nil || pipeline.HasErrors(problems) || p.Escalation.MaxOpen != 1 {
		t.Fatalf("relay pipeline: %v %v (max open %d)", err, problems, p.Escalation.MaxOpen)
	}
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.draft = &recorder{name: "draft", spend: 100_000}
	e.judge = &recorder{name: "judge", spend: 50_000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL}}
	e.st, e.client = startStack(t, stack.Config{Pipelines: map[string]*pipeline.Pipeline{p.Name: p}, Agents: []agentrunner.Agent{e.draft, e.judge}})
	e.input = mustInput(t, e.st)
	ctx := context.Background()

	first, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if first.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("first run %s, want ESCALATED", first.GetState())
	}
	_, err = e.client.SubmitJob(ctx, e.request("relay", "tkt_2", "", e.defaultBudget))
	st := status.Convert(err)
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if st.Code() != codes.ResourceExhausted || delay <= 0 || !strings.Contains(st.Message(), "max_open_escalations 1") {
		t.Fatalf("submit with the desk full = %v (retry delay %s); want RESOURCE_EXHAUSTED naming the cap, with a RetryInfo delay", err, delay)
	}
	if list, err := e.client.ListJobs(ctx, &handoffv1.ListJobsRequest{}); err != nil || len(list.GetJobs()) != 1 {
		t.Fatalf("runs after the shed submit: %d, %v; want only the first", len(list.GetJobs()), err)
	}
	if e.draft.calls() != 1 {
		t.Fatalf("draft calls %d; a shed job must cost no agent call", e.draft.calls())
	}
	if got := openGauge(t, e.st); got != 1 {
		t.Fatalf("handoff_escalations_open{pipeline=relay} = %v, want 1", got)
	}
	if _, err := e.client.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: first.GetRunId(), Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "dup"}}}); err != nil {
		t.Fatal(err)
	}
	if got := openGauge(t, e.st); got != 0 {
		t.Fatalf("gauge after the decision = %v, want 0", got)
	}
	if _, err := e.client.SubmitJob(ctx, e.request("relay", "tkt_2", "", e.defaultBudget)); err != nil {
		t.Fatalf("submit once the desk has room: %v", err)
	}
}

func openGauge(t *testing.T, st *stack.Stack) float64 {
	t.Helper()
	mfs, err := st.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "handoff_escalations_open" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pipeline" && l.GetValue() == "relay" {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatal("no handoff_escalations_open{pipeline=relay} metric")
	return 0
}

// By pipeline policy (when_full: human) a full desk degrades intake to human-only: the new
// job goes straight to the queue, ESCALATED DESK_FULL, with no agent call and nothing spent.
func TestDeskFullHumanOnly(t *testing.T) {
	src := strings.Replace(fmt.Sprintf(relay, 20, 0), "escalation: {route: humans, ", "escalation: {route: humans, max_open_escalations: 1, when_full: human, ", 1)
	p, problems, err := pipeline.Parse("relay.yaml", []byte(src))
	if err != nil || pipeline.HasErrors(problems) || p.Escalation.WhenFull != pipeline.WhenFullHuman {
		t.Fatalf("relay pipeline: %v %v", err, problems)
	}
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.draft = &recorder{name: "draft", spend: 100_000}
	e.judge = &recorder{name: "judge", spend: 50_000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL}}
	e.st, e.client = startStack(t, stack.Config{Pipelines: map[string]*pipeline.Pipeline{p.Name: p}, Agents: []agentrunner.Agent{e.draft, e.judge}})
	e.input = mustInput(t, e.st)
	if first, _ := e.submit(t, "relay", "tkt_1", "", e.defaultBudget); first.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Fatalf("first run %s, want ESCALATED", first.GetState())
	}
	calls := e.draft.calls()
	second, _ := e.submit(t, "relay", "tkt_2", "", e.defaultBudget)
	if second.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || second.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_DESK_FULL ||
		second.GetSpentUsdMicros() != 0 || second.GetHops() != 0 || e.draft.calls() != calls {
		t.Fatalf("second run %s %v, spent %d, hops %d, draft calls %d→%d; want ESCALATED DESK_FULL with no agent call", second.GetState(), second.GetEscalation(), second.GetSpentUsdMicros(), second.GetHops(), calls, e.draft.calls())
	}
	if got := openGauge(t, e.st); got != 2 {
		t.Fatalf("queue depth %v, want 2", got)
	}
}
