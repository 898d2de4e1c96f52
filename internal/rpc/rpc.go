// Package rpc builds the services' gRPC servers and client connections. The interceptor
// chain is assembled here and nowhere else, so its order is decided once:
//
//	stats handler  otelgrpc: a span per RPC, trace context read from (server) or written to
//	               (client) gRPC metadata. A stats handler, not an interceptor, so it also
//	               sees calls the chain refuses.
//	  limits       (limits.go) before any of it, as the call opens: calls in flight are
//	               capped in two pools (services, and callers without a service identity),
//	               and a call whose request does not arrive in time is cancelled; the
//	               chain's first interceptor marks the request's arrival.
//	1 metrics      per-method RPC counts and latency (go-grpc-middleware prometheus), outside
//	               everything that can refuse a call, so refusals are counted too.
//	2 ack counter  one count per Ack sent, whoever sends it: the handler or an interceptor
//	               below that rejects the package.
//	3 logging      one line per finished call with its code, duration and trace id, built
//	               only when the logger writes its level (calllog.go).
//	4 identity     who is calling (mTLS or service token) and whether the method allows
//	               them; unauthenticated callers stop here, before any package is read.
//	  utf8         a request with invalid UTF-8 in a string field is InvalidArgument naming
//	               the field (the server's codec marks it instead of failing; see utf8.go).
//	5 trace        joins the call to its package's trace (the package wins over metadata).
//	6 enforcement  the service's own: validation, budget, idempotency, in the order the
//	               service passes them (validation first, so the rest see valid packages).
//	7 recovery     innermost, so a handler panic becomes codes.Internal that the metrics and
//	               logs above still record.
package rpc

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/telemetry"
)

// ServerConfig describes one service's server.
type ServerConfig struct {
	// Service names the service in logs.
	Service        string
	Logger         *slog.Logger
	TracerProvider oteltrace.TracerProvider
	// Metrics, when set, records RPC and ack metrics.
	Metrics *telemetry.Metrics
	// Identity interceptors (step 4); nil leaves calls unauthenticated (tests only).
	IdentityUnary  grpc.UnaryServerInterceptor
	IdentityStream grpc.StreamServerInterceptor
	// The service's enforcement interceptors (step 6), outermost first.
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
	// Creds are the transport credentials (mTLS); nil means plaintext.
	Creds credentials.TransportCredentials
	// Limits cap the calls in flight and enforce keepalive; zero fields take the defaults.
	Limits Limits
	// Identified, when set, tells whether a call's caller proves a service identity as the
	// call opens (identity.Authorizer.Identified): the others get their own smaller pool of
	// Limits, so they cannot fill the server for the services.
	Identified func(context.Context) bool
	// Options are appended to the server options.
	Options []grpc.ServerOption
}

var propagators = propagation.TraceContext{}

// NewServer returns a gRPC server with the chain above and cfg.Limits (streams capped per
// connection and server-wide, keepalive enforced). Register services, health and
// reflection on it.
func NewServer(cfg ServerConfig) *grpc.Server {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("service", cfg.Service)
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	recoverOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error (the panic is in the server log)")
	})}

	// First: the request has arrived (the limits' request timer stops).
	unary := []grpc.UnaryServerInterceptor{requestUnary}
	stream := []grpc.StreamServerInterceptor{requestStream}
	if cfg.Metrics != nil {
		unary = append(unary, cfg.Metrics.RPC.UnaryServerInterceptor(), cfg.Metrics.AckUnaryInterceptor())
		stream = append(stream, cfg.Metrics.RPC.StreamServerInterceptor(), cfg.Metrics.AckStreamInterceptor())
	}
	unary = append(unary, logUnary(log))
	stream = append(stream, logStream(log))
	if cfg.IdentityUnary != nil {
		unary = append(unary, cfg.IdentityUnary)
	}
	if cfg.IdentityStream != nil {
		stream = append(stream, cfg.IdentityStream)
	}
	unary = append(unary, utf8Unary)
	stream = append(stream, utf8Stream)
	topts := []trace.Option{trace.WithTracerProvider(tp), trace.WithLogger(log)}
	unary = append(unary, trace.UnaryServerInterceptor(topts...))
	stream = append(stream, trace.StreamServerInterceptor(topts...))
	unary = append(unary, cfg.Unary...)
	stream = append(stream, cfg.Stream...)
	unary = append(unary, recovery.UnaryServerInterceptor(recoverOpts...))
	stream = append(stream, recovery.StreamServerInterceptor(recoverOpts...))

	chain := newStreamChain(stream)
	opts := []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagators))),
		grpc.ChainUnaryInterceptor(unary...),
		// The stream chain's links are made once per method, not per call (chain.go).
		grpc.StreamInterceptor(chain.intercept),
		// Only with the utf8 interceptors above: the codec leaves them a marked request.
		grpc.ForceServerCodecV2(newUTF8Codec()),
		// Each stream on a goroutine whose stack has already grown to the chain's depth: a
		// fresh goroutine per stream starts small and copies its stack a few times on the way
		// down the interceptors (runtime.morestack, 4-9 % of a hop's CPU). When every worker
		// is busy, gRPC starts a goroutine as before, so a slow agent holds no one up.
		grpc.NumStreamWorkers(streamWorkers()),
	}
	opts = append(opts, cfg.Limits.serverOptions(cfg.Identified)...)
	if cfg.Creds != nil {
		opts = append(opts, grpc.Creds(cfg.Creds))
	}
	g := grpc.NewServer(append(opts, cfg.Options...)...)
	chain.server.Store(g)
	return g
}

// DialConfig describes a client connection from one service to another.
type DialConfig struct {
	TracerProvider oteltrace.TracerProvider
	// Creds are the transport credentials (mTLS); nil means plaintext (loopback only).
	Creds credentials.TransportCredentials
	// PerRPC, when set, attaches the caller's identity (a service token) to every call.
	PerRPC credentials.PerRPCCredentials
}

// Reconnect is how a service's client connection dials again after its peer went away:
// from 100ms, growing by 1.6 to at most 2s between attempts. gRPC's default starts at 1s and
// grows to 2 minutes, so a runner or writeback that a supervisor restarts in under a second
// would sit unreached for a second or more (and longer after a few failed attempts) while
// every hop to it fails fast; at most one dial every 2s per connection is still cheap
// through a long outage.
var Reconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// Dial returns a client connection whose calls carry the W3C trace context in metadata and
// that dials again as Reconnect says.
func Dial(addr string, cfg DialConfig) (*grpc.ClientConn, error) {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	creds := cfg.Creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(Reconnect),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagators))),
	}
	if cfg.PerRPC != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(cfg.PerRPC))
	}
	return grpc.NewClient(addr, opts...)
}

// streamWorkers is how many goroutines a server keeps for its streams: four per CPU the Go
// scheduler runs, and at least minStreamWorkers. A hop's stream spends most of its time
// waiting on the store, so a server holds many more streams than it has CPUs: with one
// coordinator sending 32 hops at once and 8 workers, three hops in four ran on a fresh
// goroutine that grew its stack down the chain again (runtime.newstack, ~3 % of a hop's CPU;
// ~1 % with 64 workers). An idle worker costs a few KiB of stack.
func streamWorkers() uint32 { return uint32(max(minStreamWorkers, 4*runtime.GOMAXPROCS(0))) }

// minStreamWorkers is streamWorkers' floor.
const minStreamWorkers = 64
