package store_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// proxyTo listens on addr and forwards every connection to target, until the test ends.
func proxyTo(t *testing.T, addr, target string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(u, c)
				io.Copy(c, u)
			}()
		}
	}()
}

// TestOpenURLWaitsForRedis: a service whose Redis comes up after it keeps trying and then
// opens the store; one whose Redis never comes gets the error after the wait.
func TestOpenURLWaitsForRedis(t *testing.T) {
	storetest.RedisClient(t) // the test Redis must answer (fails in CI when it does not)
	addr := freeAddr(t)
	spec := "redis://" + addr + "/0?prefix=" + url.QueryEscape(storetest.RedisPrefix(t))
	var retries atomic.Int32
	up := make(chan struct{})
	go func() {
		for retries.Load() < 2 { // Redis "starts" after two failed attempts
			time.Sleep(10 * time.Millisecond)
		}
		proxyTo(t, addr, storetest.RedisAddr())
		close(up)
	}()
	st, err := store.OpenURLWait(context.Background(), spec, 30*time.Second, func(err error, pause time.Duration) {
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("retry error %q does not name the address %s", err, addr)
		}
		retries.Add(1)
	})
	if err != nil {
		t.Fatalf("OpenURLWait with Redis coming up late: %v", err)
	}
	defer st.Close()
	<-up
	if err := st.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := retries.Load(); n < 2 {
		t.Fatalf("%d retries reported; want at least 2 before Redis came up", n)
	}

	start := time.Now()
	gone := "redis://" + freeAddr(t) + "/0"
	_, err = store.OpenURLWait(context.Background(), gone, 300*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "still unreachable after waiting 300ms") {
		t.Fatalf("OpenURLWait with no Redis = %v; want the connection error and how long it waited", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 10*time.Second {
		t.Fatalf("gave up after %v; want about the 300ms wait", d)
	}
}

// TestOpenURLWaitFailsAtOnceOnWrongSettings: nothing that waiting cannot fix is retried: a bad
// URL, a Redis that answers with a refusal (a database it does not have).
func TestOpenURLWaitFailsAtOnceOnWrongSettings(t *testing.T) {
	storetest.RedisClient(t)
	for _, spec := range []string{
		"redis://127.0.0.1/0",                        // no port
		"redis://" + storetest.RedisAddr() + "/9999", // Redis answers: DB index is out of range
	} {
		called := false
		start := time.Now()
		_, err := store.OpenURLWait(context.Background(), spec, time.Minute, func(error, time.Duration) { called = true })
		if err == nil || called || time.Since(start) > 15*time.Second {
			t.Errorf("OpenURLWait(%s) = %v after %v, retried %v; want an error at once", store.Redact(spec), err, time.Since(start), called)
		}
	}
}
