package store

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Before go-redis hands out a pooled connection it peeks at its socket (a recvfrom with
// MSG_PEEK|MSG_DONTWAIT) to find one the server has closed. With retries off (see
// OpenRedis) that peek is what keeps a connection closed while idle, by a restart or a
// failover, from failing the next command. It is also one system call per command, on
// every command: 19 on a five-stage job, 3 % of its CPU on Redis (bench/README.md).
//
// A connection that read a reply within heardWithin is not peeked at. Under load every
// pooled connection is reused within milliseconds, so the peek is saved there; a quiet
// connection is peeked at as before. What is given up: a connection the server closed
// less than heardWithin after its last reply, while the server still accepts new ones,
// fails its next command (the caller's retry runs on a new connection). That takes a
// deliberate close (CLIENT KILL, client eviction, an output-buffer limit) or a restart
// completed within heardWithin; Redis's idle timeout counts whole seconds. A close while
// the server is down fails new connections just the same. The go-redis maintainers point
// to a Dialer as the place for this policy (redis/go-redis#3060; the cost: #2599).
const heardWithin = 50 * time.Millisecond

// dialRedis dials as go-redis's default dialer does without TLS and wraps the connection
// in a heardConn. go-redis applies Options.TLSConfig only in its own dialer: OpenRedis
// sets none, and one that adds TLS must do the handshake here.
func dialRedis(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout: timeout,
		// go-redis's default: probe after 30s idle, three probes 5s apart.
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3},
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc, ok := c.(syscall.Conn)
		if !ok {
			return c, nil
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return c, nil
		}
		return &heardConn{Conn: c, raw: raw}, nil
	}
}

// clock is the monotonic base of heardConn's times: a wall clock stepped back would make
// every connection look recently heard, and switch the peek off until it caught up.
var clock = time.Now()

// heardConn is a connection that remembers when it last read data, and whose SyscallConn
// lets go-redis's peek through only once that is longer ago than heardWithin.
type heardConn struct {
	net.Conn
	raw   syscall.RawConn
	heard atomic.Int64 // time.Since(clock) at the last Read that returned data, plus 1; 0: never
}

func (c *heardConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.heard.Store(int64(time.Since(clock)) + 1)
	}
	return n, err
}

func (c *heardConn) SyscallConn() (syscall.RawConn, error) { return heardRaw{c}, nil }

// heardRaw is the connection's RawConn with Read, the peek's way in, skipped while the
// server was heard from recently (a skipped Read reports the connection healthy, as a
// peek that finds nothing to read does).
type heardRaw struct{ c *heardConn }

func (r heardRaw) Control(f func(fd uintptr)) error { return r.c.raw.Control(f) }

func (r heardRaw) Write(f func(fd uintptr) bool) error { return r.c.raw.Write(f) }

func (r heardRaw) Read(f func(fd uintptr) bool) error {
	if h := r.c.heard.Load(); h != 0 {
		if d := time.Duration(int64(time.Since(clock)) + 1 - h); d >= 0 && d < heardWithin {
			return nil
		}
	}
	return r.c.raw.Read(f)
}
