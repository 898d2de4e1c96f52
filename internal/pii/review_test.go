package pii_test

import (
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/testkit"
)

// Review: prose a stage writes outside the named fields is never screened. A tool
// attempt's detail rides on job.tools_tried into every later package. A judge's
// failure detail rides on job.evaluator into the next stage's package (driver.go), a failed
// stage's error becomes the escalation detail stored on the run, and both are returned by
// GetJob/WatchJob. Scan skips repeated messages (evaluator.failures) and does not know the
// names "detail" or "error".
func TestReviewScanMissesJudgeDetailAndStageError(t *testing.T) {
	cases := []struct {
		name string
		m    *handoffv1.StageResult
		want []pii.Finding
	}{
		{"a judge's failure detail", &handoffv1.StageResult{Evaluator: &handoffv1.Evaluator{
			LastVerdict: handoffv1.Verdict_VERDICT_FAIL,
			Failures:    []*handoffv1.Failure{{Code: "tone", Detail: "reply to jane@example.com was rude"}},
		}}, []pii.Finding{{Field: "evaluator.failures[0].detail", Kind: pii.KindEmail}}},
		{"a tool attempt's detail (carried in every later package's tools_tried)", &handoffv1.StageResult{
			ToolsTried: []*handoffv1.ToolAttempt{{Name: "crm.lookup", Detail: "no customer for jane@example.com"}},
		}, []pii.Finding{{Field: "tools_tried[0].detail", Kind: pii.KindEmail}}},
		{"a memory ref whose id is the fact itself (valid kind:id, so the contract passes it)", &handoffv1.StageResult{
			MemoryRefs: []string{"customer_email:jane@example.com"},
		}, []pii.Finding{{Field: "memory_refs[0]", Kind: pii.KindEmail}}},
		{"a failed stage's error", &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_FAILED,
			Error: "card " + card + " declined"}, []pii.Finding{{Field: "error", Kind: pii.KindCard}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testkit.Equal(t, pii.Builtin().Scan(c.m), c.want, "findings")
		})
	}
	// The submitter's tracestate is copied into every package (Trace.tracestate) and never
	// screened: a vendor entry can carry an address to every stage.
	req := &handoffv1.SubmitJobRequest{Goal: "ok", Trace: &handoffv1.Trace{Tracestate: "crm=jane@example.com"}}
	testkit.Equal(t, pii.Builtin().Scan(req), []pii.Finding{{Field: "trace.tracestate", Kind: pii.KindEmail}}, "submit findings")
	// The same detail as the next stage receives it, on the package.
	p := testkit.Package(func(p *handoffv1.HandoffPackage) {
		p.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL,
			Failures: []*handoffv1.Failure{{Code: "tone", Detail: "call " + piiPhoneT}}}
	})
	testkit.Equal(t, pii.Builtin().Scan(p), []pii.Finding{{Field: "evaluator.failures[0].detail", Kind: pii.KindPhone}}, "package findings")
}
