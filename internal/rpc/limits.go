package rpc

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Limits bound what callers can hold open on a server. A zero field takes its default.
type Limits struct {
	// MaxStreams caps the calls in flight on the whole server, over all connections; a
	// call past it is refused with ResourceExhausted before it is read (a tap handle), and
	// health checks are exempt so a busy server still answers its probes. Default 2048.
	MaxStreams int
	// MaxStreamsPerConn is HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: a client queues
	// (grpc-go) or is refused (RST_STREAM REFUSED_STREAM) past it. One coordinator holds
	// one connection to each runner, so this also caps the stages one coordinator has in
	// flight on one runner. Default 256.
	MaxStreamsPerConn uint32
	// KeepaliveTime is how long a connection may be silent before the server pings it,
	// and KeepaliveTimeout how long the ping may go unanswered before the connection is
	// closed: a dead client stops holding streams. Defaults 30s and 10s.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// IdleTimeout closes a connection with no call for this long (GOAWAY; grpc-go clients
	// reconnect on their next call). Default 5m.
	IdleTimeout time.Duration
	// MinPingInterval is the keepalive enforcement: a client pinging more often (with or
	// without calls open) is sent GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and cut off.
	// Default 10s.
	MinPingInterval time.Duration
	// MaxAnonymousStreams caps the calls in flight from callers the server cannot tie to a
	// service identity when the call opens (no verified certificate, no service token that
	// verifies: an operator token or nothing at all). They have their own pool, so they
	// cannot take the slots of the services' calls. It applies when ServerConfig.Identified
	// is set. Default 256.
	MaxAnonymousStreams int
	// RequestTimeout bounds how long a call may take to deliver its request message once
	// it opened: past it the call is cancelled and its slot given back, so a caller that
	// opens calls and never sends holds nothing for long. Default 10s.
	RequestTimeout time.Duration
	// MaxHeaderBytes caps a call's header block (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE);
	// a service token is a few hundred bytes. Default 64 KiB.
	MaxHeaderBytes uint32
}

// Default limits (see Limits).
const (
	DefaultMaxStreams        = 2048
	DefaultMaxStreamsPerConn = 256
	DefaultKeepaliveTime     = 30 * time.Second
	DefaultKeepaliveTimeout  = 10 * time.Second
	DefaultIdleTimeout       = 5 * time.Minute
	DefaultMinPingInterval   = 10 * time.Second
	DefaultMaxAnonymous      = 256
	DefaultRequestTimeout    = 10 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// withDefaults returns l with each zero field set to its default.
func (l Limits) withDefaults() Limits {
	set := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if l.MaxStreams <= 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxStreamsPerConn == 0 {
		l.MaxStreamsPerConn = DefaultMaxStreamsPerConn
	}
	set(&l.KeepaliveTime, DefaultKeepaliveTime)
	set(&l.KeepaliveTimeout, DefaultKeepaliveTimeout)
	set(&l.IdleTimeout, DefaultIdleTimeout)
	set(&l.MinPingInterval, DefaultMinPingInterval)
	set(&l.RequestTimeout, DefaultRequestTimeout)
	if l.MaxAnonymousStreams <= 0 {
		l.MaxAnonymousStreams = DefaultMaxAnonymous
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l
}

// serverOptions are the grpc.ServerOptions that enforce l; identified, when set, sorts
// calls into the services' pool and the anonymous one.
func (l Limits) serverOptions(identified func(context.Context) bool) []grpc.ServerOption {
	l = l.withDefaults()
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxStreamsPerConn),
		grpc.MaxHeaderListSize(l.MaxHeaderBytes),
		grpc.InTapHandle(streamCap(l, identified)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.IdleTimeout,
			Time:              l.KeepaliveTime,
			Timeout:           l.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             l.MinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}

// healthCheck is exempt from the server-wide cap: a probe must not fail because callers
// filled the server.
const healthCheck = "/grpc.health.v1.Health/Check"

// streamCap counts the server's calls in two pools (identified callers, and the others
// when identified is set) and refuses one past its pool's cap. It runs on the connection's
// reader goroutine before the stream exists, so it only counts and arms the request timer:
// the stream's context ends however the stream does (finished, reset, connection closed,
// or its request late), and that gives the slot back.
func streamCap(l Limits, identified func(context.Context) bool) tap.ServerInHandle {
	var services, anonymous atomic.Int64
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if info.FullMethodName == healthCheck {
			return ctx, nil
		}
		pool, max, who := &services, int64(l.MaxStreams), ""
		if identified != nil && !identified(ctx) {
			pool, max, who = &anonymous, int64(l.MaxAnonymousStreams), " from callers without a service identity"
		}
		if pool.Add(1) > max {
			pool.Add(-1)
			return nil, status.Errorf(codes.ResourceExhausted, "the server has its limit of %d calls in flight%s; retry later", max, who)
		}
		ctx, cancel := context.WithCancel(ctx)
		g := &requestGate{timer: time.AfterFunc(l.RequestTimeout, cancel)}
		context.AfterFunc(ctx, func() {
			g.timer.Stop()
			pool.Add(-1)
		})
		return context.WithValue(ctx, requestGateKey{}, g), nil
	}
}

// requestGate is a call's request timer: armed when the call opens, stopped when its
// request message has arrived (requestArrived).
type requestGate struct{ timer *time.Timer }

type requestGateKey struct{}

// requestArrived stops the request timer of the call of ctx.
func requestArrived(ctx context.Context) {
	if g, ok := ctx.Value(requestGateKey{}).(*requestGate); ok {
		g.timer.Stop()
	}
}

// requestUnary is the chain's first unary interceptor: a unary handler runs once its
// request has been read.
func requestUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	requestArrived(ctx)
	return handler(ctx, req)
}

// requestStream is the chain's first stream interceptor: the request has arrived with the
// stream's first message.
func requestStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &firstMessage{ServerStream: ss})
}

type firstMessage struct {
	grpc.ServerStream
	seen bool
}

func (f *firstMessage) RecvMsg(m any) error {
	err := f.ServerStream.RecvMsg(m)
	if !f.seen && err == nil {
		f.seen = true
		requestArrived(f.Context())
	}
	return err
}
