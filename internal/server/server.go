// Package server assembles a service's gRPC server, the one way every binary and `handoff
// up` do it: the interceptor chain (internal/rpc, with the service's own enforcement as its
// step 6), the identity check, grpc.health.v1 following the service's store, server
// reflection, per-method metrics, and a graceful stop with a bound.
//
//	srv, err := server.New(runner.Service(),
//		server.WithSecurity(creds, authz),
//		server.WithLogger(log), server.WithTracerProvider(tp), server.WithMetrics(reg),
//		server.WithHealthFrom(st, time.Second),
//		server.WithStopTimeout(grace))
//	err = srv.Run(ctx, lis) // serves until ctx ends, then stops gracefully
//
// Health is SERVING for "" and every registered service while the store's Ping succeeds,
// NOT_SERVING while it fails, and NOT_SERVING for good from the start of a stop, so a load
// balancer stops sending before the server stops taking calls.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/telemetry"
)

// Service is what a service brings to its server: its name, its handlers and its own
// enforcement interceptors.
type Service struct {
	// Name is the service's identity: its name in logs, traces and metrics (service=...).
	Name string
	// Register registers the service's handlers on the server.
	Register func(*grpc.Server)
	// Unary and Stream are the service's enforcement (step 6 of the chain), outermost
	// first: validation, budget, idempotency.
	Unary  []grpc.UnaryServerInterceptor
	Stream []grpc.StreamServerInterceptor
}

// Server is one assembled gRPC server.
type Server struct {
	g     *grpc.Server
	hs    *health.Server
	names []string // the health service names: "" and every registered service
	o     options
	log   *slog.Logger

	watch     context.Context // the health watch's; ends with the first stop
	endWatch  context.CancelFunc
	serveOnce sync.Once
	drainOnce sync.Once
}

// ErrNoIdentity is New's answer when neither WithSecurity nor WithoutIdentity was given:
// a server never silently serves without an identity check.
var ErrNoIdentity = errors.New("server: no identity check: give WithSecurity (or WithoutIdentity, in tests)")

// New assembles svc's server. It does not listen; Serve or Run does.
func New(svc Service, opts ...Option) (*Server, error) {
	if svc.Name == "" || svc.Register == nil {
		return nil, errors.New("server: the service needs a Name and a Register func")
	}
	o := options{stopTimeout: DefaultStopTimeout, healthInterval: DefaultHealthInterval}
	for _, opt := range opts {
		opt(&o)
	}
	if o.authz == nil && !o.noIdentity {
		return nil, ErrNoIdentity
	}
	log := o.log
	if log == nil {
		log = slog.Default()
	}
	cfg := rpc.ServerConfig{
		Service: svc.Name, Logger: log, TracerProvider: o.tp, Creds: o.creds,
		Unary: svc.Unary, Stream: svc.Stream, Limits: o.limits,
	}
	if o.authz != nil {
		cfg.IdentityUnary, cfg.IdentityStream = o.authz.UnaryServerInterceptor(), o.authz.StreamServerInterceptor()
		// Callers without a service identity get their own pool of Limits.
		cfg.Identified = o.authz.Identified
	}
	if o.reg != nil {
		cfg.Metrics = telemetry.NewMetrics(o.reg, svc.Name)
	}
	g := rpc.NewServer(cfg)
	svc.Register(g)
	s := &Server{g: g, hs: health.NewServer(), names: []string{""}, o: o, log: log.With("service", svc.Name)}
	for name := range g.GetServiceInfo() {
		s.names = append(s.names, name)
		s.hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(g, s.hs)
	reflection.Register(g)
	if cfg.Metrics != nil {
		cfg.Metrics.RPC.InitializeMetrics(g) // every method's series exists from the start, at 0
	}
	s.watch, s.endWatch = context.WithCancel(context.Background())
	return s, nil
}

// GRPC is the assembled grpc.Server (for GetServiceInfo and the like; serve it with Serve).
func (s *Server) GRPC() *grpc.Server { return s.g }

// Serve serves on lis until the server stops; it returns nil after a stop. The health
// watch on the store starts with the first Serve.
func (s *Server) Serve(lis net.Listener) error {
	s.serveOnce.Do(func() {
		if s.o.store != nil {
			go rpc.WatchStoreHealth(s.watch, s.o.store, s.hs, s.names, s.o.healthInterval, s.log)
		}
	})
	return s.g.Serve(lis)
}

// Run serves on lis until ctx ends, then stops gracefully (GracefulStop). It returns the
// error that ended serving, if serving failed first.
func (s *Server) Run(ctx context.Context, lis net.Listener) error {
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	select {
	case err := <-served:
		s.Stop()
		return err
	case <-ctx.Done():
	}
	s.GracefulStop()
	return <-served
}

// Drain sets health NOT_SERVING for good (later store checks change nothing) and runs the
// WithDrain funcs; calls still go on being served. Only the first call does anything.
func (s *Server) Drain() {
	s.drainOnce.Do(func() {
		s.endWatch()
		s.hs.Shutdown()
		for _, f := range s.o.drain {
			f()
		}
	})
}

// GracefulStop drains, then stops taking calls and waits for those in flight, for at most
// the stop timeout (WithStopTimeout); the calls still running then are cut (Unavailable).
func (s *Server) GracefulStop() {
	s.Drain()
	done := make(chan struct{})
	go func() { s.g.GracefulStop(); close(done) }()
	t := time.NewTimer(s.o.stopTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("graceful stop timed out; cutting the calls still running", "stop_timeout", s.o.stopTimeout.String())
		s.g.Stop()
		<-done
	}
}

// Stop drains and cuts every call at once.
func (s *Server) Stop() {
	s.Drain()
	s.g.Stop()
}

// options are New's settings; see the With funcs.
type options struct {
	creds          credentials.TransportCredentials
	authz          *identity.Authorizer
	noIdentity     bool
	log            *slog.Logger
	tp             oteltrace.TracerProvider
	reg            prometheus.Registerer
	store          rpc.Pinger
	healthInterval time.Duration
	limits         rpc.Limits
	stopTimeout    time.Duration
	drain          []func()
}

// Option configures New.
type Option func(*options)

// WithSecurity sets the transport credentials (nil: plaintext, which rpc.Security allows on
// loopback only) and the identity check of step 4 of the chain.
func WithSecurity(creds credentials.TransportCredentials, authz *identity.Authorizer) Option {
	return func(o *options) { o.creds, o.authz = creds, authz }
}

// WithoutIdentity serves without an identity check: for tests of what lies behind it.
func WithoutIdentity() Option { return func(o *options) { o.noIdentity = true } }

// WithLogger sets the logger (default slog.Default()); lines carry service=<Name>.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithTracerProvider sets the tracer provider of the server's spans (default: none).
func WithTracerProvider(tp oteltrace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithMetrics registers the service's RPC and ack metrics on reg, labelled service=<Name>.
func WithMetrics(reg prometheus.Registerer) Option { return func(o *options) { o.reg = reg } }

// WithHealthFrom makes health follow st: pinged at Serve and every interval (0: the
// default), NOT_SERVING while the ping fails. Without it health stays SERVING until a stop.
func WithHealthFrom(st rpc.Pinger, interval time.Duration) Option {
	return func(o *options) {
		o.store = st
		if interval > 0 {
			o.healthInterval = interval
		}
	}
}

// WithLimits sets the streams cap and keepalive (zero fields: rpc's defaults).
func WithLimits(l rpc.Limits) Option { return func(o *options) { o.limits = l } }

// WithStopTimeout bounds how long GracefulStop waits for the calls in flight (default
// DefaultStopTimeout).
func WithStopTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.stopTimeout = d
		}
	}
}

// WithDrain adds f to what a stop does once health is NOT_SERVING and before the server
// stops taking calls: the coordinator lets its drivers finish their hops there.
func WithDrain(f func()) Option { return func(o *options) { o.drain = append(o.drain, f) } }
