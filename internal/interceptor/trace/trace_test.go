package trace

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

const (
	pkgTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	mdTP  = "00-11111111111111111111111111111111-2222222222222222-01"
)

func setup(t *testing.T) (*tracetest.InMemoryExporter, *bytes.Buffer, []Option) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	var logs bytes.Buffer
	return exp, &logs, []Option{WithTracerProvider(tp), WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}
}

func TestUnary(t *testing.T) {
	tests := []struct {
		name       string
		pkgTrace   string
		mdTrace    string
		wantTrace  string
		wantParent string
		wantWarn   bool
	}{
		{"package trace continues", pkgTP, "", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", false},
		{"package wins over metadata", pkgTP, mdTP, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true},
		{"no package trace: metadata's, and the package is stamped", "", mdTP, "11111111111111111111111111111111", "2222222222222222", false},
		// No traceparent in the metadata: the span in the context is the stats handler's
		// new trace, not the caller's, and no mismatch.
		{"no metadata trace, a server span of its own", pkgTP, "local:" + mdTP, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", false},
		// Metadata on the package's trace id is not parsed again: whatever else it says, the
		// parent is still the package's span, and there is no mismatch.
		{"metadata on the package's trace, another span", pkgTP, "00-4bf92f3577b34da6a3ce929d0e0e4736-3333333333333333-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", false},
		{"malformed metadata on the package's trace id", pkgTP, "zz-4bf92f3577b34da6a3ce929d0e0e4736-zzzz-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp, logs, opts := setup(t)
			ctx := context.Background()
			if local, ok := strings.CutPrefix(tt.mdTrace, "local:"); ok {
				ctx, _ = Parse(ctx, local, "")
			} else if tt.mdTrace != "" {
				ctx, _ = Parse(ctx, tt.mdTrace, "")
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("traceparent", tt.mdTrace))
			}
			req := &handoffv1.CheckRequest{Package: &handoffv1.HandoffPackage{JobId: "tkt_1", Stage: "draft"}}
			if tt.pkgTrace != "" {
				req.Package.Trace = &handoffv1.Trace{Traceparent: tt.pkgTrace}
			}
			var handlerTrace string
			_, err := UnaryServerInterceptor(opts...)(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/handoff.v1.AgentRunnerService/Check"},
				func(ctx context.Context, _ any) (any, error) {
					handlerTrace = oteltrace.SpanContextFromContext(ctx).TraceID().String()
					return &handoffv1.CheckResponse{}, nil
				})
			if err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if len(spans) != 1 || spans[0].Name != "handoff.ack draft" {
				t.Fatalf("spans %v, want one handoff.ack draft", spans)
			}
			if handlerTrace != tt.wantTrace || spans[0].SpanContext.TraceID().String() != tt.wantTrace || spans[0].Parent.SpanID().String() != tt.wantParent {
				t.Fatalf("handler trace %s, span trace %s parent %s; want trace %s parent %s", handlerTrace, spans[0].SpanContext.TraceID(), spans[0].Parent.SpanID(), tt.wantTrace, tt.wantParent)
			}
			if got := strings.Contains(logs.String(), "trace mismatch"); got != tt.wantWarn {
				t.Fatalf("mismatch logged = %v, want %v: %s", got, tt.wantWarn, logs.String())
			}
			if got := req.GetPackage().GetTrace().GetTraceparent(); !strings.Contains(got, tt.wantTrace) {
				t.Fatalf("package traceparent %q, want it on trace %s", got, tt.wantTrace)
			}
		})
	}
}

type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
	req *handoffv1.DeliverRequest
}

func (f *fakeStream) Context() context.Context    { return f.ctx }
func (f *fakeStream) SetHeader(metadata.MD) error { return nil }
func (f *fakeStream) SendMsg(any) error           { return nil }
func (f *fakeStream) RecvMsg(m any) error {
	m.(*handoffv1.DeliverRequest).Package = f.req.Package
	return nil
}

func TestStreamJoinsAtFirstReceive(t *testing.T) {
	exp, _, opts := setup(t)
	ctx, _ := Parse(context.Background(), mdTP, "")
	ss := &fakeStream{ctx: ctx, req: &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "j", Stage: "judge", Trace: &handoffv1.Trace{Traceparent: pkgTP}}}}
	var got string
	err := StreamServerInterceptor(opts...)(nil, ss, &grpc.StreamServerInfo{FullMethod: "/handoff.v1.AgentRunnerService/Deliver"},
		func(_ any, s grpc.ServerStream) error {
			var req handoffv1.DeliverRequest
			if err := s.RecvMsg(&req); err != nil {
				return err
			}
			got = oteltrace.SpanContextFromContext(s.Context()).TraceID().String()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if got != "4bf92f3577b34da6a3ce929d0e0e4736" || len(exp.GetSpans()) != 1 {
		t.Fatalf("handler context on trace %s with %d spans; want the package's trace and one span", got, len(exp.GetSpans()))
	}
}

// TestParseAsMapCarrier: Parse and Format read and write exactly what the W3C propagator
// does through a MapCarrier, for valid, invalid and tracestate-carrying input.
func TestParseAsMapCarrier(t *testing.T) {
	for _, in := range []struct{ tp, ts string }{
		{pkgTP, ""}, {pkgTP, "vendor=a,other=b"}, {mdTP, "x=1"}, {"", ""}, {"", "x=1"},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", ""},
		{"garbage", "x=1"},
	} {
		got, ok := Parse(context.Background(), in.tp, in.ts)
		mc := propagation.MapCarrier{"traceparent": in.tp}
		if in.ts != "" {
			mc["tracestate"] = in.ts
		}
		want := w3c.Extract(context.Background(), mc)
		gs, ws := oteltrace.SpanContextFromContext(got), oteltrace.SpanContextFromContext(want)
		if !gs.Equal(ws) || ok != ws.IsValid() {
			t.Errorf("Parse(%q, %q) = %v (ok %v), want %v", in.tp, in.ts, gs, ok, ws)
		}
		out := propagation.MapCarrier{}
		w3c.Inject(got, out)
		if f := Format(got); f != out["traceparent"] {
			t.Errorf("Format after Parse(%q) = %q, want %q", in.tp, f, out["traceparent"])
		}
	}
}

// TestMetadataTrace: the caller's metadata trace against the package's, including a
// metadata traceparent on the package's trace id that is itself malformed (no trace: no
// mismatch) and one of another trace.
func TestMetadataTrace(t *testing.T) {
	pctx, _ := Parse(context.Background(), pkgTP, "")
	pkg := oteltrace.SpanContextFromContext(pctx).TraceID()
	other, _ := Parse(context.Background(), mdTP, "")
	for _, tt := range []struct {
		md   string
		want oteltrace.TraceID
	}{
		{"", oteltrace.TraceID{}},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01", pkg},
		{mdTP, oteltrace.SpanContextFromContext(other).TraceID()},
		{"zz-4bf92f3577b34da6a3ce929d0e0e4736", pkg}, // the package's id: no mismatch either way
		{"00-4bf92f3577b34da6a3ce929d0e0e473", oteltrace.TraceID{}},
	} {
		ctx := context.Background()
		if tt.md != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("traceparent", tt.md))
		}
		got := metadataTrace(ctx, pkg, pkgTP)
		if got != tt.want {
			t.Errorf("metadataTrace(%q) = %v, want %v", tt.md, got, tt.want)
		}
		if mismatch := got.IsValid() && got != pkg; mismatch != (tt.md == mdTP) {
			t.Errorf("metadata %q: mismatch %v", tt.md, mismatch)
		}
	}
}
