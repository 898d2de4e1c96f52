package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/traceparent"
)

// TestOneTracePerJob runs the support job with an in-memory span exporter and checks that
// the coordinator's send span, the receiver's ack span and the writeback receipt of every
// hop are on the job's one trace, and that each ack span is the child of its send span (the
// package's traceparent, not only gRPC metadata, carried it).
//
// With draft on handoff.v2 too: the receiver's trace interceptor reads a v2 package's
// traceparent as it does a v1 one's.
func TestOneTracePerJob(t *testing.T) {
	for name, v2 := range map[string][]string{"v1": nil, "draft on v2": {"draft"}} {
		t.Run(name, func(t *testing.T) { oneTracePerJob(t, v2) })
	}
}

func oneTracePerJob(t *testing.T, v2 []string) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.st, e.client = startStack(t, stack.Config{TracerProvider: tp, V2Agents: v2})
	e.input = mustInput(t, e.st)
	job, _ := e.submit(t, "support-ticket", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job %s: %v", job.GetState(), job.GetEscalation())
	}
	want := traceparent.TraceID(job.GetTraceparent())
	if got := traceparent.TraceID(job.GetReceipt().GetTraceparent()); got != want {
		t.Fatalf("receipt on trace %s, job on %s", got, want)
	}
	// The last hop's send span ends when its driver returns from the hop, just after the
	// run's final event, which is what ended the watch: wait for it (the loop ends once it is
	// there, so the bound only matters to a slow machine).
	var sends map[string]sdktrace.ReadOnlySpan // span id -> send span
	var acks []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); ; {
		sends, acks = map[string]sdktrace.ReadOnlySpan{}, nil
		for _, s := range exp.GetSpans().Snapshots() {
			switch {
			case strings.HasPrefix(s.Name(), "handoff.send "):
				sends[s.SpanContext().SpanID().String()] = s
			case strings.HasPrefix(s.Name(), "handoff.ack "):
				acks = append(acks, s)
			}
		}
		if (len(sends) >= 7 && len(acks) >= 7) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(sends) != 7 || len(acks) != 7 {
		t.Fatalf("%d send spans and %d ack spans, want 7 each (intake, retrieve, draft, judge, draft, judge, writeback)", len(sends), len(acks))
	}
	for _, s := range sends {
		if s.SpanContext().TraceID().String() != want {
			t.Errorf("send span %s on trace %s, want %s", s.Name(), s.SpanContext().TraceID(), want)
		}
	}
	for _, a := range acks {
		if a.SpanContext().TraceID().String() != want {
			t.Errorf("ack span %s on trace %s, want %s", a.Name(), a.SpanContext().TraceID(), want)
		}
		send, ok := sends[a.Parent().SpanID().String()]
		if !ok || strings.TrimPrefix(send.Name(), "handoff.send ") != strings.TrimPrefix(a.Name(), "handoff.ack ") {
			t.Errorf("ack span %s is not the child of its stage's send span (parent %s)", a.Name(), a.Parent().SpanID())
		}
	}
}

// TestFanOutTrace runs research-brief with an in-memory span exporter: each branch's hop
// spans are children of its branch span, each branch span a child of the fan-out span; the
// merge's send span links every branch span; the sub-job's nested hops are children of the
// subjob stage's span; all of it on the job's one trace.
func TestFanOutTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.st, e.client = startStack(t, stack.Config{TracerProvider: tp})
	e.input = mustInput(t, e.st)
	job, evs := e.submit(t, "research-brief", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job %s: %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	want := traceparent.TraceID(job.GetTraceparent())
	var byName map[string][]sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); ; {
		byName = map[string][]sdktrace.ReadOnlySpan{}
		for _, s := range exp.GetSpans().Snapshots() {
			byName[s.Name()] = append(byName[s.Name()], s)
		}
		if len(byName["handoff.send writeback"]) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	one := func(name string) sdktrace.ReadOnlySpan {
		t.Helper()
		if len(byName[name]) != 1 {
			t.Fatalf("%d spans %q, want 1", len(byName[name]), name)
		}
		s := byName[name][0]
		if s.SpanContext().TraceID().String() != want {
			t.Errorf("span %s on trace %s, want the job's %s", name, s.SpanContext().TraceID(), want)
		}
		return s
	}
	fan := one("handoff.fanout lookups")
	branchIDs := map[string]bool{}
	for branch, stage := range map[string]string{"policy": "policy-lookup", "history": "history-lookup"} {
		b := one("handoff.branch " + branch)
		if b.Parent().SpanID() != fan.SpanContext().SpanID() {
			t.Errorf("branch span %s is not the fan-out span's child", branch)
		}
		if h := one("handoff.send " + stage); h.Parent().SpanID() != b.SpanContext().SpanID() {
			t.Errorf("hop span of %s is not its branch span's child", stage)
		}
		branchIDs[b.SpanContext().SpanID().String()] = true
	}
	merge := one("handoff.send brief")
	linked := map[string]bool{}
	for _, l := range merge.Links() {
		linked[l.SpanContext.SpanID().String()] = true
	}
	for id := range branchIDs {
		if !linked[id] {
			t.Errorf("the merge's span does not link branch span %s (links %v)", id, linked)
		}
	}
	sub := one("handoff.subjob draft")
	for _, stage := range []string{"intake", "retrieve"} {
		if h := one("handoff.send " + stage); h.Parent().SpanID() != sub.SpanContext().SpanID() {
			t.Errorf("the sub-run's %s hop span is not a child of the subjob stage's span", stage)
		}
	}
}
