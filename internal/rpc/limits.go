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
}

// Default limits (see Limits).
const (
	DefaultMaxStreams        = 2048
	DefaultMaxStreamsPerConn = 256
	DefaultKeepaliveTime     = 30 * time.Second
	DefaultKeepaliveTimeout  = 10 * time.Second
	DefaultIdleTimeout       = 5 * time.Minute
	DefaultMinPingInterval   = 10 * time.Second
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
	return l
}

// serverOptions are the grpc.ServerOptions that enforce l.
func (l Limits) serverOptions() []grpc.ServerOption {
	l = l.withDefaults()
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxStreamsPerConn),
		grpc.InTapHandle(streamCap(l.MaxStreams)),
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

// streamCap counts the server's streams and refuses one past max. It runs on the
// connection's reader goroutine before the stream exists, so it only counts: the stream's
// context ends however the stream does (finished, reset, connection closed), and that
// gives the slot back.
func streamCap(max int) tap.ServerInHandle {
	var n atomic.Int64
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if info.FullMethodName == healthCheck {
			return ctx, nil
		}
		if n.Add(1) > int64(max) {
			n.Add(-1)
			return nil, status.Errorf(codes.ResourceExhausted, "the server has its limit of %d calls in flight; retry later", max)
		}
		context.AfterFunc(ctx, func() { n.Add(-1) })
		return ctx, nil
	}
}
