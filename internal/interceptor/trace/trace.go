// Package trace keeps one W3C trace across every hop of a job. The trace travels twice:
// in gRPC metadata (otelgrpc's stats handler reads and writes it) and in the package's
// trace.traceparent, so a package read from a file, a queue or grpcurl still joins the trace
// it came from. When the two disagree the package wins: it is the durable record of the
// job, metadata is whatever the last client happened to send. The mismatch is logged.
package trace

import (
	"context"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
)

// TracerName is the instrumentation scope of the spans this package starts.
const TracerName = "github.com/handoffhq/handoff/internal/interceptor/trace"

var w3c = propagation.TraceContext{}

// Format renders the span context in ctx as a traceparent ("" when there is none).
func Format(ctx context.Context) string {
	c := &carrier{}
	w3c.Inject(ctx, c)
	return c.traceparent
}

// Parse returns ctx carrying tp as its remote parent span context, and whether tp was a
// valid traceparent.
func Parse(ctx context.Context, tp, tracestate string) (context.Context, bool) {
	out := w3c.Extract(ctx, &carrier{traceparent: tp, tracestate: tracestate})
	return out, oteltrace.SpanContextFromContext(out).IsValid()
}

// carrier is the W3C propagator's carrier for the two headers it reads and writes: a
// MapCarrier would allocate a map on every hop for the same two strings. An empty value is
// an absent header, as for MapCarrier.
type carrier struct{ traceparent, tracestate string }

func (c *carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.traceparent
	case "tracestate":
		return c.tracestate
	}
	return ""
}

func (c *carrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.traceparent = value
	case "tracestate":
		c.tracestate = value
	}
}

func (c *carrier) Keys() []string {
	var keys []string
	if c.traceparent != "" {
		keys = append(keys, "traceparent")
	}
	if c.tracestate != "" {
		keys = append(keys, "tracestate")
	}
	return keys
}

type options struct {
	tp  oteltrace.TracerProvider
	log *slog.Logger
}

// Option configures the interceptors.
type Option func(*options)

// WithTracerProvider sets the provider spans are started with (required in practice: the
// global provider is a no-op that makes no trace ids).
func WithTracerProvider(tp oteltrace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithLogger sets where trace mismatches are logged.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

func build(opts []Option) *options {
	o := &options{log: slog.Default()}
	for _, f := range opts {
		f(o)
	}
	if o.tp == nil {
		o.tp = noop.NewTracerProvider()
	}
	return o
}

// join starts the hop's server span. With a package traceparent, the span continues the
// package's trace; without one, it continues the metadata's (or a new) trace and the
// package is stamped with it, so the stages after this one see the same trace.
func (o *options) join(ctx context.Context, fullMethod string, req any) (context.Context, oteltrace.Span) {
	p := hop.FindPackage(req) // the request's own package: stamping it below stamps the request
	if p == nil {
		// A handoff.v2 package: the same fields, read through its v1 view (a copy); the
		// stamp is then written back to the v2 package itself.
		if p2 := hop.FindPackageV2(req); p2 != nil {
			p = &handoffv1.HandoffPackage{JobId: p2.GetJobId(), Stage: p2.GetStage()}
			if t := p2.GetTrace(); t != nil {
				p.Trace = &handoffv1.Trace{Traceparent: t.GetTraceparent(), Tracestate: t.GetTracestate()}
			}
			defer func() {
				if p2.GetTrace().GetTraceparent() == "" && p.GetTrace().GetTraceparent() != "" {
					p2.Trace = &handoffv2.Trace{Traceparent: p.GetTrace().GetTraceparent()}
				}
			}()
		}
	}
	parent := ctx
	var name string
	var attrs []attribute.KeyValue
	if p == nil {
		name = "handoff " + strings.TrimPrefix(fullMethod, "/")
	} else {
		attrs = append(attrs, attribute.String("handoff.job_id", p.GetJobId()), attribute.String("handoff.stage", p.GetStage()))
		name = "handoff.ack " + p.GetStage()
		if pctx, ok := Parse(ctx, p.GetTrace().GetTraceparent(), p.GetTrace().GetTracestate()); ok {
			pkg := oteltrace.SpanContextFromContext(pctx)
			if md := metadataTrace(ctx, pkg.TraceID(), p.GetTrace().GetTraceparent()); md.IsValid() && md != pkg.TraceID() {
				o.log.WarnContext(ctx, "trace mismatch: metadata and package carry different traces; the package's wins",
					"method", fullMethod, "job_id", p.GetJobId(), "stage", p.GetStage(),
					"metadata_trace_id", md.String(), "package_trace_id", pkg.TraceID().String())
			}
			parent = pctx
		}
	}
	ctx, span := o.tp.Tracer(TracerName).Start(parent, name, oteltrace.WithSpanKind(oteltrace.SpanKindInternal), oteltrace.WithAttributes(attrs...))
	if p != nil && p.GetTrace().GetTraceparent() == "" {
		if tp := Format(ctx); tp != "" {
			p.Trace = &handoffv1.Trace{Traceparent: tp}
		}
	}
	return ctx, span
}

// metadataTrace is the trace of the caller's metadata (its traceparent), invalid when it
// sends none. Not the context's span: for a call without a traceparent the stats handler
// starts a new trace of this server, which disagrees with every package and is no mismatch.
// pkg is the package's trace, parsed from its valid traceparent pkgTP: a metadata
// traceparent with the same trace-id part (the usual case: the caller sent the hop on the
// package's trace) is pkg or invalid, a mismatch either way not, so it is not parsed.
func metadataTrace(ctx context.Context, pkg oteltrace.TraceID, pkgTP string) oteltrace.TraceID {
	// The one key, not FromIncomingContext's copy of the whole metadata map.
	v := metadata.ValueFromIncomingContext(ctx, "traceparent")
	if len(v) == 0 {
		return oteltrace.TraceID{}
	}
	// "<2 hex version>-<32 hex trace id>-<16 hex span id>-<2 hex flags>"
	if tp := v[0]; len(tp) >= 35 && len(pkgTP) >= 35 && tp[3:35] == pkgTP[3:35] {
		return pkg
	}
	c, _ := Parse(context.Background(), v[0], "")
	return oteltrace.SpanContextFromContext(c).TraceID()
}

func end(span oteltrace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, status.Convert(err).Message())
	}
	span.End()
}

// UnaryServerInterceptor joins each call to its package's trace.
func UnaryServerInterceptor(opts ...Option) grpc.UnaryServerInterceptor {
	o := build(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, span := o.join(ctx, info.FullMethod, req)
		resp, err := handler(ctx, req)
		end(span, err)
		return resp, err
	}
}

// StreamServerInterceptor does the same for streams. The request is only known once it is
// received, so the span starts at the first RecvMsg and Context() returns the joined
// context from then on (the generated handlers receive before they read the context).
func StreamServerInterceptor(opts ...Option) grpc.StreamServerInterceptor {
	o := build(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		w := &stream{ServerStream: ss, o: o, method: info.FullMethod, ctx: ss.Context()}
		err := handler(srv, w)
		if w.span != nil {
			end(w.span, err)
		}
		return err
	}
}

type stream struct {
	grpc.ServerStream
	o      *options
	method string
	ctx    context.Context
	span   oteltrace.Span
}

func (s *stream) Context() context.Context { return s.ctx }

func (s *stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.span == nil {
		s.ctx, s.span = s.o.join(s.ctx, s.method, m)
	}
	return nil
}
