package telemetry_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/handoffhq/handoff/internal/telemetry"
)

// Review: the invoke_agent span's error is masked by its caller (agentrunner Deliver), but
// an execute_tool span takes the tool's error as is (llmagent/loop.go: end(err)), and a
// tool's error is what a system of record answered ("no customer jane@example.com"): the
// personal data lands in the trace backend, which the pii policy means to keep it out of.
func TestReviewToolSpanErrorCarriesNoPersonalData(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, root := tp.Tracer("t").Start(context.Background(), "deliver")
	ctx, agent := telemetry.StartAgent(ctx, "draft", "draft")
	end := telemetry.StartTool(ctx, "crm.lookup", "call_1")
	end(errors.New("crm: no customer for jane@example.com"))
	agent.End(nil)
	root.End()
	for _, s := range exp.GetSpans() {
		if strings.Contains(s.Status.Description, "jane@example.com") {
			t.Errorf("span %q status holds the e-mail address: %q", s.Name, s.Status.Description)
		}
	}
}
