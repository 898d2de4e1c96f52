package coordinator_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// TestEndedParentEndsItsNestedRun: a parent run can escalate at its subjob stage with its
// nested run still RUNNING (its deadline passed while no replica drove it, so its next step
// escalates DEADLINE before the subjob stage resumes the nested run). A person then fails the
// parent. The nested run must end with it: nothing else ever would (the scan and drive skip
// nested runs, and a decision on a nested run is refused), so it would stay RUNNING for good,
// a run listed as in progress that no replica drives.
func TestEndedParentEndsItsNestedRun(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		e := startSub(t, s, 5)
		ctx := context.Background()
		const parent, child = "run_orphan", "run_orphan-sub-0"
		past := timestamppb.New(time.Now().Add(-time.Hour))
		if _, _, err := e.st.Store.CreateRun(ctx, &handoffv1.Job{RunId: child, Pipeline: "inner", Stage: "work", State: handoffv1.JobState_JOB_STATE_RUNNING,
			ParentRunId: parent, ParentStage: "sub", WalletRunId: parent, Hops: 1, Deadline: past}); err != nil {
			t.Fatal(err)
		}
		if err := e.st.Store.FenceRunAt(ctx, child, 1); err != nil { // the parent's driver that died
			t.Fatal(err)
		}
		if _, _, err := e.st.Store.CreateRun(ctx, &handoffv1.Job{RunId: parent, JobId: "tkt_orphan", Pipeline: "outer", Stage: "sub", State: handoffv1.JobState_JOB_STATE_ESCALATED,
			Deadline: past, Escalations: 1, Escalation: &handoffv1.Escalation{Number: 1, Cause: handoffv1.EscalationCause_ESCALATION_CAUSE_DEADLINE, Stage: "sub", Detail: "deadline passed"},
			Children: []*handoffv1.SubJobRef{{Stage: "sub", RunId: child, Pipeline: "inner", State: handoffv1.JobState_JOB_STATE_RUNNING}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.client.ResolveEscalation(op(), &handoffv1.ResolveEscalationRequest{RunId: parent, Operator: "bo", Escalation: 1,
			Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "too late"}}}); err != nil {
			t.Fatal(err)
		}
		p, err := e.st.Store.GetRun(ctx, parent)
		if err != nil || p.GetState() != handoffv1.JobState_JOB_STATE_FAILED {
			t.Fatalf("parent after the fail = %v, %v", p.GetState(), err)
		}
		if ref := p.GetChildren()[0]; ref.GetState() == handoffv1.JobState_JOB_STATE_RUNNING {
			t.Errorf("the failed parent still lists its nested run as RUNNING")
		}
		c, err := e.st.Store.GetRun(ctx, child)
		if err != nil || c.GetState() != handoffv1.JobState_JOB_STATE_FAILED {
			t.Fatalf("nested run after its parent failed = %v, %v; want FAILED with it", c.GetState(), err)
		}
	})
}
