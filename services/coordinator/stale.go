package coordinator

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
)

// The stale plan: a reviser that answers a judge's FAIL with the very bytes the judge
// rejected has not revised anything, and sending them to the judge again only spends a
// round. The rail compares digests (sha256), never contents.

// Failure the rail adds to the evaluator when it sends an identical revision back.
const (
	FailureStale       = "revision_identical"
	FailureStaleDetail = "revision identical to the rejected draft"
	RuleStalePlan      = "stale_plan"
)

// staleRevision decides about the result res of stage st when the job came to st for a
// revision (a judge's FAIL, or the rail's own send-back of an identical revision): a result
// artifact whose sha256 equals that of the latest earlier artifact of its schema version
// (the draft the judge rejected) is stale. ok is false when it is not (or st is not
// revising). The run's artifacts already hold res's (the driver appends them first).
func staleRevision(p *pipeline.Pipeline, st *pipeline.Stage, job *handoffv1.Job, res *handoffv1.StageResult) (t transition, ok bool) {
	again := arrivedBy(job, st.Name, handoffv1.Move_MOVE_STALE_REVISION)
	if !again && !arrivedBy(job, st.Name, handoffv1.Move_MOVE_REVISE) {
		return transition{}, false
	}
	arts := job.GetArtifacts()
	earlier := arts[:max(len(arts)-len(res.GetArtifacts()), 0)]
	for i, a := range res.GetArtifacts() {
		prev := latestArtifact(earlier, a.GetSchemaVersion())
		if a.GetSha256() == "" || prev == nil || prev.GetSha256() != a.GetSha256() {
			continue
		}
		reason := &handoffv1.Reason{Field: fmt.Sprintf("artifacts[%d].sha256", i), Rule: RuleStalePlan,
			Message: fmt.Sprintf("%s: %s (%s)", FailureStaleDetail, a.GetSchemaVersion(), prev.GetUri())}
		switch {
		case again:
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_STALE_PLAN,
				fmt.Sprintf("stage %s sent the rejected draft back unchanged again after the rail returned it once", st.Name), []*handoffv1.Reason{reason}), true
		case p.StaleRevision == pipeline.StaleEscalate:
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_STALE_PLAN,
				fmt.Sprintf("stage %s answered the judge's FAIL with the rejected draft unchanged", st.Name), []*handoffv1.Reason{reason}), true
		}
		// Back to the reviser once, not to the judge: no revision is taken (no judge ran),
		// and the arrival is a new visit, so the runner runs the stage again.
		return transition{Action: actMove, Transfer: transfer(p, job, st.Name, st.Name, handoffv1.Move_MOVE_STALE_REVISION, nil), Stale: true}, true
	}
	return transition{}, false
}

// withStaleFailure is ev with the stale-revision failure added (once): the package back to
// the reviser says why it came back. The verdict stays the judge's FAIL.
func withStaleFailure(ev *handoffv1.Evaluator) *handoffv1.Evaluator {
	out := proto.Clone(ev).(*handoffv1.Evaluator)
	if out == nil {
		out = &handoffv1.Evaluator{}
	}
	for _, f := range out.GetFailures() {
		if f.GetCode() == FailureStale {
			return out
		}
	}
	if len(out.Failures) < 32 {
		out.Failures = append(out.Failures, &handoffv1.Failure{Code: FailureStale, Detail: FailureStaleDetail})
	}
	return out
}
