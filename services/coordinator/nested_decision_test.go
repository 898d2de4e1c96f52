package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// TestDecisionOnNestedRunRefused: a nested run is its parent driver's to fence and drive, and
// its escalation is decided on its parent. A claim or decision named by the nested run's own
// id is refused (FailedPrecondition naming the parent) before it takes anything: it neither
// moves the nested run's fence past the parent driver's epoch (which would stop that driver
// at its next save of the nested run), nor saves the nested run RUNNING again where no
// driver would ever take it (the scan and drive skip nested runs).
func TestDecisionOnNestedRunRefused(t *testing.T) {
	e := startOp(t, 0, nil)
	ctx := context.Background()
	const parent = "run_parent"
	esc := &handoffv1.Escalation{Number: 1, Cause: handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, Stage: "draft", Detail: "draft failed"}
	cases := []struct {
		name  string
		state handoffv1.JobState
		call  func(runID string) error
	}{
		{"claim of a running nested run", handoffv1.JobState_JOB_STATE_RUNNING, func(id string) error {
			_, err := e.client.ClaimEscalation(op(), &handoffv1.ClaimEscalationRequest{RunId: id, Escalation: 1})
			return err
		}},
		{"return of an escalated nested run", handoffv1.JobState_JOB_STATE_ESCALATED, func(id string) error {
			_, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: id, Operator: "bo", Escalation: 1,
				Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft"}}})
			return err
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			child := parent + "-sub-" + string(rune('0'+i))
			j := &handoffv1.Job{RunId: child, ParentRunId: parent, ParentStage: "sub", Pipeline: "relay", State: c.state, Stage: "draft"}
			if c.state == handoffv1.JobState_JOB_STATE_ESCALATED {
				j.Escalation, j.Escalations = esc, 1
			}
			if _, _, err := e.st.Store.CreateRun(ctx, j); err != nil {
				t.Fatal(err)
			}
			if err := e.st.Store.FenceRunAt(ctx, child, 3); err != nil { // its parent's driver holds epoch 3
				t.Fatal(err)
			}
			err := c.call(child)
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "of run "+parent) {
				t.Errorf("decision on the nested run = %v; want FailedPrecondition naming its parent %s", err, parent)
			}
			got, err := e.st.Store.GetRun(ctx, child)
			if err != nil || got.GetState() != c.state {
				t.Errorf("nested run after the decision: %v, %v; want it left %s", got.GetState(), err, c.state)
			}
			if err := e.st.Store.PutRunFenced(ctx, j, 3); err != nil {
				t.Errorf("the parent driver's save of its nested run after the decision = %v; want it still fenced by epoch 3", err)
			}
		})
	}
}

// TestDecisionOnMissingRunFencesNothing: a claim or decision naming a run that does not
// exist is NotFound and leaves nothing behind: no fence of the missing run (a caller could
// otherwise make the store keep a fence for every id it invents), so the first driver of a
// run by that id later takes its first epoch.
func TestDecisionOnMissingRunFencesNothing(t *testing.T) {
	e := startOp(t, 0, nil)
	ctx := context.Background()
	calls := map[string]func(runID string) error{
		"claim": func(id string) error {
			_, err := e.client.ClaimEscalation(op(), &handoffv1.ClaimEscalationRequest{RunId: id, Escalation: 1})
			return err
		},
		"resolve": func(id string) error {
			_, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: id, Operator: "bo", Escalation: 1,
				Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "r"}}})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			id := "run_invented_" + name
			if err := call(id); status.Code(err) != codes.NotFound {
				t.Errorf("%s of a missing run = %v; want NotFound", name, err)
			}
			if epoch, err := e.st.Store.FenceRun(ctx, id); err != nil || epoch != 1 {
				t.Errorf("the missing run's next epoch = %d, %v; want 1 (no fence left behind)", epoch, err)
			}
		})
	}
}
