package main

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

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

// Two processes given the same redis:// --store share completion records. Needs a Redis
// (storetest: HANDOFF_TEST_REDIS or 127.0.0.1:6379; fails under CI without one, skipped
// elsewhere). The --store URLs name a prefix unique to the test, deleted afterwards.
func TestOpenStoreRedisShared(t *testing.T) {
	prefix := "?prefix=" + url.QueryEscape(storetest.RedisPrefix(t))
	ctx := context.Background()
	specA := "redis://" + storetest.RedisAddr() + "/0" + prefix
	a, err := store.OpenURL(ctx, specA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := store.OpenURL(ctx, "redis://"+storetest.RedisAddr()+prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if nameA := store.Redact(specA); strings.Contains(nameA, "@") {
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
