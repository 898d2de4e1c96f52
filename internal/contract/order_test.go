package contract

import (
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
)

// TestCheckV1ReasonsInOrder pins every reason, in order, for one package with faults across
// its fields: two rules broken on one string, repeated items, nested messages, a
// message-level rule and the trace. A caller reads the reasons in this order in an ack, so
// a protovalidate or cel-go upgrade that adds, drops or reorders any of them fails here,
// where it can be judged, instead of changing acks unseen.
func TestCheckV1ReasonsInOrder(t *testing.T) {
	v := newValidator(t)
	p := &handoffv1.HandoffPackage{
		Schema:      V1,
		JobId:       "-" + strings.Repeat("j", 128), // pattern and max_len
		Stage:       "Draft",
		Goal:        "g",
		Constraints: []string{"ok", "", strings.Repeat("c", 501)},
		Artifacts: []*handoffv1.Artifact{
			{Type: "chunks", SchemaVersion: "chunks.v1", Uri: "s3://b/k"},
			{Type: "Chunks", SchemaVersion: "chunks", Uri: "not a uri", Sha256: "ABC", ProducedBy: "Intake"},
		},
		ToolsTried: []*handoffv1.ToolAttempt{
			{Name: "kb.search", Ok: true, ErrorCode: "timeout"},
			{Name: "9tool", DurationMs: -1},
		},
		Budget: &handoffv1.Budget{UsdRemainingMicros: -5},
		Trace:  &handoffv1.Trace{Traceparent: "00-00000000000000000000000000000000-0000000000000000-01"},
	}
	var got []string
	for _, r := range v.CheckV1(p) {
		got = append(got, r.GetField()+" "+r.GetRule())
	}
	want := []string{
		"job_id string.max_len", "job_id string.pattern",
		"stage string.pattern",
		"constraints[1] string.min_len", "constraints[2] string.max_len",
		"artifacts[1].type string.pattern", "artifacts[1].schema_version string.pattern", "artifacts[1].uri string.uri",
		"artifacts[1].sha256 string.pattern", "artifacts[1].produced_by string.pattern",
		"tools_tried[0] tool_attempt.error_code", "tools_tried[1].name string.pattern", "tools_tried[1].duration_ms int64.gte",
		"budget.usd_remaining_micros int64.gte",
		"trace.traceparent traceparent.nonzero",
	}
	testkit.Equal(t, got, want, "reasons, in order")
}
