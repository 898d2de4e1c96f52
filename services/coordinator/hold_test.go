package coordinator_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// slowDecision is the store as a decision that takes a while sees it: its wallet read
// (ResolveEscalation reads the run's wallet after it holds the run) waits, once armed.
type slowDecision struct {
	store.Store
	armed atomic.Bool
	wait  time.Duration
}

func (s *slowDecision) Wallet(ctx context.Context, id string) (*handoffv1.Budget, error) {
	if s.armed.Load() {
		time.Sleep(s.wait)
	}
	return s.Store.Wallet(ctx, id)
}

// TestSlowDecisionKeepsItsHold: a person's decision holds the run's lease and epoch as a
// driver does, so it keeps the lease as a driver does while it works. A decision that takes
// longer than the lease's TTL (an edit stored, a PII scan, a slow store) is not overtaken by
// another replica's takeover watch, whose driver would take a newer epoch and leave the
// decision's own save refused: the decision lands, and the run is as it left it.
func TestSlowDecisionKeepsItsHold(t *testing.T) {
	r := startReplicas(t)
	ctx := context.Background()
	const id = "run_slow_decision"
	if _, _, err := r.st.Store.CreateRun(ctx, &handoffv1.Job{RunId: id, JobId: "tkt_slow", Pipeline: "relay", Stage: "draft", State: handoffv1.JobState_JOB_STATE_ESCALATED,
		Escalations: 1, Escalation: &handoffv1.Escalation{Number: 1, Cause: handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, Stage: "draft", Detail: "draft failed"}}); err != nil {
		t.Fatal(err)
	}
	slow := &slowDecision{Store: r.st.Store, wait: 4 * r.opts.LeaseTTL}
	a := r.replica(t, "replica-a", slow)
	r.replica(t, "replica-b", r.st.Store) // its watch takes over any lease that lapses
	slow.armed.Store(true)
	_, err := a.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: id, Operator: "bo", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "customer withdrew"}}})
	slow.armed.Store(false)
	if err != nil {
		t.Fatalf("a decision that took %s (lease %s) = %v; want it to land", slow.wait, r.opts.LeaseTTL, err)
	}
	if j, err := r.st.Store.GetRun(ctx, id); err != nil || j.GetState() != handoffv1.JobState_JOB_STATE_FAILED {
		t.Fatalf("run after the decision = %v, %v; want FAILED", j.GetState(), err)
	}
}
