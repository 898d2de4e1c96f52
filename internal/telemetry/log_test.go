package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	oteltrace "go.opentelemetry.io/otel/trace"
)

func TestLogHandlerAddsTrace(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("service", "agentrunner")
	tid, _ := oteltrace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := oteltrace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := oteltrace.ContextWithSpanContext(context.Background(), oteltrace.NewSpanContext(oteltrace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	log.InfoContext(ctx, "stage completed", "job_id", "tkt_1", "stage", "draft")
	log.Info("no span")
	dec := json.NewDecoder(&buf)
	var first, second map[string]any
	if err := dec.Decode(&first); err != nil {
		t.Fatal(err)
	}
	if err := dec.Decode(&second); err != nil {
		t.Fatal(err)
	}
	if first["trace_id"] != tid.String() || first["span_id"] != sid.String() || first["job_id"] != "tkt_1" || first["service"] != "agentrunner" {
		t.Fatalf("record with a span = %v; want trace_id, span_id, job_id and service", first)
	}
	if _, ok := second["trace_id"]; ok {
		t.Fatalf("record without a span got a trace id: %v", second)
	}
}
