package storetest

// Redis test setup, the one every Redis test uses. The rule: the server is HANDOFF_TEST_REDIS
// or 127.0.0.1:6379; without one a test fails under CI (env CI non-empty: CI must never skip
// silently) and is skipped elsewhere, saying how to start one. Each test writes under its own
// key prefix and deletes the keys under it, and only those, when it ends.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/store"
)

// RedisAddr is the server the Redis tests use: HANDOFF_TEST_REDIS, or 127.0.0.1:6379.
func RedisAddr() string {
	if a := os.Getenv("HANDOFF_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// OpenRedis opens a store on the test server under a prefix unique to t (see RedisPrefix).
// When t ends the store is closed and the keys under its prefix, and only those, are deleted.
// Without a server: t.Fatal under CI, else t.Skip.
func OpenRedis(t testing.TB) *store.Redis {
	t.Helper()
	return OpenRedisPrefix(t, RedisPrefix(t))
}

// RedisClient returns a raw client on the test server (retries off, as store.OpenRedis wants
// of a shared client), closed when t ends. Without a server: t.Fatal under CI, else t.Skip.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := RedisAddr()
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		msg := fmt.Sprintf("no Redis at %s (%v): start one with `redis-server --port 6379 --save '' --appendonly no`, or point HANDOFF_TEST_REDIS at one", addr, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// RedisPrefix returns a key prefix unique to t: "handofftest:" + t.Name() (characters other
// than letters, digits, '-', '_' and '.' replaced by '_') + ":" + random hex + ":". When t
// ends, after the cleanups registered later (such as closing the stores opened on it), the
// keys under it, and only those, are deleted. It needs the server: without one, t.Fatal
// under CI, else t.Skip.
func RedisPrefix(t testing.TB) string {
	t.Helper()
	rdb := RedisClient(t)
	prefix := uniquePrefix(t)
	t.Cleanup(func() {
		ctx := context.Background()
		keys := RedisKeys(t, rdb, prefix)
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if err := rdb.Del(ctx, keys[:n]...).Err(); err != nil {
				t.Errorf("cleanup %s*: %v", prefix, err)
				return
			}
			keys = keys[n:]
		}
	})
	return prefix
}

// OpenRedisPrefix opens a store on the test server under prefix, closed when t ends: a second
// store on one prefix is what another process sharing the server sees. The prefix's keys are
// deleted only if it came from RedisPrefix.
func OpenRedisPrefix(t testing.TB, prefix string) *store.Redis {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := store.OpenRedis(ctx, store.RedisOptions{Addr: RedisAddr(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// RedisKeys lists the keys under prefix (SCAN, the prefix matched literally). It fails the
// test if SCAN fails or answers a key outside the prefix.
func RedisKeys(t testing.TB, rdb *redis.Client, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	iter := rdb.Scan(ctx, 0, globEscape(prefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if !strings.HasPrefix(k, prefix) { // never touch another test's keys
			t.Errorf("SCAN %s* answered %q, outside the prefix", prefix, k)
			continue
		}
		keys = append(keys, k)
	}
	if err := iter.Err(); err != nil {
		t.Errorf("scan %s*: %v", prefix, err)
		return nil
	}
	return keys
}

// sanitize keeps a test name readable in a key: letters, digits, '-', '_' and '.' stay,
// anything else (the '/' of subtests, spaces, SCAN pattern characters) becomes '_'.
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, name)
}

// globEscape quotes the pattern characters of SCAN MATCH, so a prefix matches literally.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// uniquePrefix is a key prefix unique to t: "handofftest:" + t.Name() (sanitized) + ":" +
// random hex + ":".
func uniquePrefix(t testing.TB) string {
	b := make([]byte, 6)
	rand.Read(b)
	return "handofftest:" + sanitize(t.Name()) + ":" + hex.EncodeToString(b) + ":"
}

// PrivateRedis starts a redis-server of t's own on a free loopback port (nothing kept on
// disk) and returns its address; it is stopped when t ends. For tests that must stall or
// break the server, which would disturb the tests sharing RedisAddr. Without redis-server
// on PATH: t.Fatal under CI, else t.Skip.
func PrivateRedis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "redis-server not found: apt-get install redis-server"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	for try := 0; ; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
		up, gone := false, false
		for deadline := time.Now().Add(5 * time.Second); !up && !gone && time.Now().Before(deadline); {
			select {
			case <-exited: // the port was taken meanwhile
				gone = true
			case <-time.After(20 * time.Millisecond):
				up = rdb.Ping(context.Background()).Err() == nil
			}
		}
		rdb.Close()
		if up {
			t.Cleanup(func() { cmd.Process.Kill(); <-exited })
			return addr
		}
		if !gone {
			cmd.Process.Kill()
			<-exited
		}
		if try == 4 {
			t.Fatalf("redis-server did not start on a free port in 5 tries")
		}
	}
}
