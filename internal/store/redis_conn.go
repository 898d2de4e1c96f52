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
// A connection that read a reply from the server within heardWithin is not peeked at: a
// server that answered that recently held the connection open then, and Redis closes
// idle clients only after whole seconds (its timeout setting), so heardWithin stays below
// the smallest. A connection quiet for longer is peeked at as before. What is given up is
// the peek in the moments after a server's restart or a failover, when the commands then
// in flight fail anyway: a connection used just before fails its next command too, like
// them, and its caller's retry runs on a new one. The go-redis maintainers point to a
// Dialer as the place for this policy (redis/go-redis#3060; the cost: #2599).
const heardWithin = 500 * time.Millisecond

// dialRedis dials as go-redis's default dialer does without TLS (OpenRedis has none) and
// wraps the connection in a heardConn.
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

// heardConn is a connection that remembers when it last read data, and whose SyscallConn
// lets go-redis's peek through only once that is longer ago than heardWithin.
type heardConn struct {
	net.Conn
	raw   syscall.RawConn
	heard atomic.Int64 // time.Now().UnixNano() of the last Read that returned data; 0: never
}

func (c *heardConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.heard.Store(time.Now().UnixNano())
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
	if h := r.c.heard.Load(); h != 0 && time.Now().UnixNano()-h < int64(heardWithin) {
		return nil
	}
	return r.c.raw.Read(f)
}
