package store_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestParseURL is every --store reading the services make (cmd/agentrunner, cmd/writeback and
// cmd/coordinator all go through OpenURL). secret, when set, must not show in the error.
func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		spec   string
		want   *store.RedisOptions // nil with wantErr false: a bbolt file path
		err    bool
		secret string
	}{
		// bbolt file paths.
		{spec: "./handoff-data/agentrunner.db"},
		{spec: "/var/lib/handoff/wb.db"},
		{spec: "handoff-data/coordinator.db"},

		// Accepted URLs (from cmd/agentrunner's TestRedisOptions).
		{spec: "redis://127.0.0.1:6379", want: &store.RedisOptions{Addr: "127.0.0.1:6379", Prefix: "handoff:"}},
		{spec: "redis://redis.internal:6380/2", want: &store.RedisOptions{Addr: "redis.internal:6380", DB: 2, Prefix: "handoff:"}},
		{spec: "redis://:s3cret@127.0.0.1:6379/0", want: &store.RedisOptions{Addr: "127.0.0.1:6379", Password: "s3cret", Prefix: "handoff:"}},
		{spec: "redis://default:s3cret@[::1]:6379/", want: &store.RedisOptions{Addr: "[::1]:6379", Password: "s3cret", Prefix: "handoff:"}},
		// (from cmd/writeback's TestParseConfigRedisStore)
		{spec: "redis://:s3cret@10.0.0.5:6379/0", want: &store.RedisOptions{Addr: "10.0.0.5:6379", Password: "s3cret", Prefix: "handoff:"}},
		{spec: "redis://[::1]:6379/", want: &store.RedisOptions{Addr: "[::1]:6379", Prefix: "handoff:"}},
		{spec: "redis://localhost:6379/15", want: &store.RedisOptions{Addr: "localhost:6379", DB: 15, Prefix: "handoff:"}},
		// The prefix query parameter.
		{spec: "redis://h:6379/1?prefix=team-a:", want: &store.RedisOptions{Addr: "h:6379", DB: 1, Prefix: "team-a:"}},
		{spec: "redis://h:6379?prefix=%7Bhandoff%7D:", want: &store.RedisOptions{Addr: "h:6379", Prefix: "{handoff}:"}},

		// Redis Cluster: a list of nodes, no database.
		{spec: "redis-cluster://127.0.0.1:7000,127.0.0.1:7001", want: &store.RedisOptions{Cluster: []string{"127.0.0.1:7000", "127.0.0.1:7001"}, Prefix: "handoff:"}},
		{spec: "redis-cluster://:s3cret@r1:6379?prefix=team-a:", want: &store.RedisOptions{Cluster: []string{"r1:6379"}, Password: "s3cret", Prefix: "team-a:"}},
		{spec: "redis-cluster://default:pa/ss@[::1]:7000,[::1]:7001", want: &store.RedisOptions{Cluster: []string{"[::1]:7000", "[::1]:7001"}, Password: "pa/ss", Prefix: "handoff:"}},
		{spec: "redis-cluster://", err: true},
		{spec: "redis-cluster://h:1,", err: true},
		{spec: "redis-cluster://h:1,h", err: true},
		{spec: "redis-cluster://h:1,h:0", err: true},
		{spec: "redis-cluster://h:1/0", err: true},
		{spec: "redis-cluster://h:1?db=0", err: true},
		{spec: "redis-cluster://h:1#f", err: true},
		{spec: "redis-cluster://h:1?wait=1&prefix=p:", want: &store.RedisOptions{Cluster: []string{"h:1"}, Prefix: "p:", WaitReplicas: 1}},
		{spec: "redis-cluster://h:1?wait=-1", err: true},
		{spec: "redis-cluster://h:1?wait=x", err: true},
		{spec: "redis-cluster://h:1?wait=1&wait=2", err: true},
		{spec: "redis-cluster://h:1?wait=6", err: true},
		{spec: "redis-cluster://bob:s3cret-user@h:1,h:2", err: true, secret: "s3cret-user"},
		{spec: "redis-cluster://:s3cret-node@h:1,h", err: true, secret: "s3cret-node"},

		// Refused (from cmd/agentrunner's TestRedisOptions).
		{spec: "redis://127.0.0.1", err: true},
		{spec: "redis:///0", err: true},
		{spec: "redis://h:1/x", err: true},
		{spec: "redis://h:1/-1", err: true},
		{spec: "redis://h:1/0?x=1", err: true},
		{spec: "rediss://h:1", err: true},
		{spec: "postgres://h:1", err: true},
		{spec: "redis://alice:pw-alice@h:1", err: true, secret: "pw-alice"},
		// (from cmd/writeback's TestParseConfigRedisStore and TestParseConfigBadValuesNameTheFlag)
		{spec: "redis://redis.internal:6379/1?x=1", err: true},
		{spec: "redis://h", err: true},
		{spec: "redis://h:6379/db", err: true},
		{spec: "rediss://h:6379", err: true},
		{spec: "redis://admin:pw-admin@h:6379", err: true, secret: "pw-admin"},
		{spec: "", err: true},
		// (from the first TestOpenURL)
		{spec: "redis://", err: true},
		{spec: "redis://127.0.0.1:6379/zero", err: true},
		// And more.
		{spec: "mysql://h:1", err: true},
		{spec: "redis://h:99999", err: true},
		{spec: "redis://h:", err: true},
		{spec: "redis://h:1/2/", err: true},
		{spec: "redis://h:1#x", err: true},
		{spec: "redis://h:1/0?prefix=", err: true},
		{spec: "redis://h:1/0?prefix=a&prefix=b", err: true},
		{spec: "redis://h:1/0?prefix=a&db=2", err: true},
		{spec: "redis://:s3cret-nohost@/0", err: true, secret: "s3cret-nohost"},
		{spec: "redis://:s3cret-db@h:1/x", err: true, secret: "s3cret-db"},
		{spec: "redis://:s3cret-q@h:1?x=1", err: true, secret: "s3cret-q"},
		{spec: "rediss://:s3cret-scheme@h:1", err: true, secret: "s3cret-scheme"},
		{spec: "redis://:s3cr%zzet@h:1", err: true, secret: "s3cr"},        // does not parse
		{spec: "redis://:pa/ss-word@h:1", err: true, secret: "ss-word"},    // "/" in the password
		{spec: "redis://:p@ss-word@h:1/x", err: true, secret: "ss-word"},   // "@" in the password
		{spec: "redis://:12/ss-word@h:1", err: true, secret: "12/ss-word"}, // parses, badly
	} {
		got, err := store.ParseURL(c.spec)
		if c.err {
			if err == nil {
				t.Errorf("ParseURL(%q) = %+v, want an error", c.spec, got)
				continue
			}
			if c.spec != "" && !strings.Contains(err.Error(), store.Redact(c.spec)) {
				t.Errorf("ParseURL(%q): %v, want an error naming %s", c.spec, err, store.Redact(c.spec))
			}
			if c.secret != "" && strings.Contains(err.Error(), c.secret) {
				t.Errorf("ParseURL(%q): %v shows the password", c.spec, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseURL(%q): %v", c.spec, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseURL(%q) = %+v, want %+v", c.spec, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	for spec, want := range map[string]string{
		"./handoff-data/h.db":             "./handoff-data/h.db",
		"/a b/100%.db":                    "/a b/100%.db",
		"redis://h:1/0":                   "redis://h:1/0",
		"redis://h:1/0?prefix=p:":         "redis://h:1/0?prefix=p:",
		"redis://:s3cret@h:1/0":           "redis://:xxxxx@h:1/0",
		"redis://default:s3cret@h:1":      "redis://default:xxxxx@h:1",
		"redis://:s3cr%zz@h:1":            "redis://:xxxxx@h:1",
		"redis://:pa/ss@h:1":              "redis://:xxxxx@h:1",
		"redis://:p@ss@h:1/0":             "redis://:xxxxx@h:1/0",
		"redis://:s3cret@h:1/0?prefix=p:": "redis://:xxxxx@h:1/0?prefix=p:",
	} {
		if got := store.Redact(spec); got != want {
			t.Errorf("Redact(%q) = %q, want %q", spec, got, want)
		}
	}
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sub", "h.db")
	s, err := store.OpenURL(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*store.Bolt); !ok {
		t.Fatalf("a path opened %T, want *store.Bolt", s)
	}
	s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the bbolt file: %v", err)
	}
	for _, bad := range []string{"redis://", "redis://127.0.0.1:6379/zero", "mysql://h:1"} {
		if _, err := store.OpenURL(ctx, bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("OpenURL(%q) = %v, want an error naming it", bad, err)
		}
	}
	if _, err := store.OpenURL(ctx, "redis://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("OpenURL(closed port) = %v, want an error naming the address", err)
	}
	// An unreachable server: the error names the URL without its password.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if _, err := store.OpenURL(ctx, "redis://:s3cret@"+addr+"/0"); err == nil ||
		!strings.Contains(err.Error(), "redis://:xxxxx@"+addr+"/0") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("OpenURL(closed port, password) = %v, want an error naming redis://:xxxxx@%s/0 only", err, addr)
	}
}

// TestOpenURLRedisPrefix: a redis:// --store opens a Redis store writing under ?prefix=.
func TestOpenURLRedisPrefix(t *testing.T) {
	rdb := storetest.RedisClient(t)
	prefix := storetest.RedisPrefix(t)
	ctx := context.Background()
	s, err := store.OpenURL(ctx, "redis://"+storetest.RedisAddr()+"/0?prefix="+url.QueryEscape(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*store.Redis); !ok {
		t.Fatalf("a redis:// URL opened %T, want *store.Redis", s)
	}
	if _, err := s.OpenWallet(ctx, "w", "job-w", &handoffv1.Budget{HopsRemaining: 1}); err != nil {
		t.Fatal(err)
	}
	if keys := storetest.RedisKeys(t, rdb, prefix); len(keys) != 1 || keys[0] != prefix+"{w}:wallet" {
		t.Fatalf("keys under %s = %v, want its {w}:wallet", prefix, keys)
	}
}
