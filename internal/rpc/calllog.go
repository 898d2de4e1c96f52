package rpc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The chain's logging step writes one line per finished call: the line go-grpc-middleware's
// logging interceptor writes for its FinishCall event (same message, keys and code-to-level
// mapping), with the call's trace id. Unlike that interceptor, which builds the line's
// fields for every call (some 75 allocations on a hop) before its logger drops them, it
// builds the line only when the logger writes the call's level: at the services' default
// level (warn) an OK call costs a level check and nothing else, and every call that ends
// with a warn or error code is logged as before.

func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		logCall(ctx, log, info.FullMethod, "unary", start, err)
		return resp, err
	}
}

func logStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		typ := "bidi_stream"
		switch {
		case info.IsClientStream && !info.IsServerStream:
			typ = "client_stream"
		case !info.IsClientStream && info.IsServerStream:
			typ = "server_stream"
		}
		logCall(ss.Context(), log, info.FullMethod, typ, start, err)
		return err
	}
}

// logCall writes the finished-call line of a call that started at start and ended with err,
// if log writes the level its code maps to.
func logCall(ctx context.Context, log *slog.Logger, fullMethod, typ string, start time.Time, err error) {
	if errors.Is(err, io.EOF) { // as the middleware: a stream's io.EOF is its normal end
		err = nil
	}
	code := status.Code(err)
	lvl := slog.Level(logging.DefaultServerCodeToLevel(code))
	if !log.Enabled(ctx, lvl) {
		return
	}
	service, method := splitMethod(fullMethod)
	attrs := make([]any, 0, 24)
	attrs = append(attrs, logging.SystemTag[0], logging.SystemTag[1], logging.ComponentFieldKey, logging.KindServerFieldValue,
		logging.ServiceFieldKey, service, logging.MethodFieldKey, method, logging.MethodTypeFieldKey, typ)
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, "peer.address", p.Addr.String())
	}
	if sc := oteltrace.SpanContextFromContext(ctx); sc.IsValid() {
		attrs = append(attrs, "trace_id", sc.TraceID().String())
	}
	attrs = append(attrs, "grpc.start_time", start.Format(time.RFC3339))
	if d, ok := ctx.Deadline(); ok {
		attrs = append(attrs, "grpc.request.deadline", d.Format(time.RFC3339))
	}
	attrs = append(attrs, "grpc.code", code.String())
	if err != nil {
		attrs = append(attrs, "grpc.error", err.Error())
	}
	attrs = append(attrs, logging.DurationToTimeMillisFields(time.Since(start))...)
	log.Log(ctx, lvl, "finished call", attrs...)
}

// splitMethod splits "/pkg.Service/Method" into its service and method.
func splitMethod(fullMethod string) (string, string) {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndex(s, "/"); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "unknown", "unknown"
}
