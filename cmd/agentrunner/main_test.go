package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/store"
)

func TestRedisOptions(t *testing.T) {
	for spec, want := range map[string]store.RedisOptions{
		"redis://127.0.0.1:6379":             {Addr: "127.0.0.1:6379", Prefix: "handoff:"},
		"redis://redis.internal:6380/2":      {Addr: "redis.internal:6380", DB: 2, Prefix: "handoff:"},
		"redis://:s3cret@127.0.0.1:6379/0":   {Addr: "127.0.0.1:6379", Password: "s3cret", Prefix: "handoff:"},
		"redis://default:s3cret@[::1]:6379/": {Addr: "[::1]:6379", Password: "s3cret", Prefix: "handoff:"},
	} {
		got, err := redisOptions(spec)
		if err != nil || got != want {
			t.Errorf("redisOptions(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for _, spec := range []string{
		"redis://127.0.0.1", "redis:///0", "redis://h:1/x", "redis://h:1/-1", "redis://h:1/0?x=1",
		"rediss://h:1", "postgres://h:1", "redis://alice:pw@h:1",
	} {
		if _, err := redisOptions(spec); err == nil {
			t.Errorf("redisOptions(%q) succeeded", spec)
		}
	}
}

func TestRunRefusesWithoutSecurity(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	base := []string{"--store", filepath.Join(dir, "r.db"), "--artifacts", filepath.Join(dir, "a"), "--listen", "127.0.0.1:0"}
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"neither":            {nil, "--certs"},
		"plaintext off host": {[]string{"--plaintext-loopback", "--listen", "0.0.0.0:0"}, "not a loopback"},
		"bad store scheme":   {[]string{"--plaintext-loopback", "--store", "mysql://h:1"}, "--store"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(append(append([]string{}, base...), c.args...), log)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run: %v, want an error naming %q", err, c.want)
			}
		})
	}
}

// Two processes given the same redis:// --store share completion records. Needs a Redis:
// HANDOFF_TEST_REDIS=host:port (skipped otherwise).
func TestOpenStoreRedisShared(t *testing.T) {
	addr := os.Getenv("HANDOFF_TEST_REDIS")
	if addr == "" {
		t.Skip("HANDOFF_TEST_REDIS is not set")
	}
	ctx := context.Background()
	a, nameA, err := openStore(ctx, "redis://"+addr+"/0")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _, err := openStore(ctx, "redis://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if strings.Contains(nameA, "@") {
		t.Errorf("store name %q", nameA)
	}
	key := "agentrunner-cmd-test:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if st, _, err := a.Claim(ctx, key, time.Minute); err != nil || st != store.Claimed {
		t.Fatalf("claim: %v %v", st, err)
	}
	defer a.Release(ctx, key)
	if st, _, err := b.Lookup(ctx, key); err != nil || st != store.Pending {
		t.Fatalf("the other process sees %v %v, want pending", st, err)
	}
}
