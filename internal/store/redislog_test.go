package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/handoffhq/handoff/internal/store"
)

// syncBuffer is a bytes.Buffer safe for the client's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRouteRedisLogs: what go-redis logs by itself while a server is unreachable arrives in
// the service's JSON log as warnings, each line a JSON record.
func TestRouteRedisLogs(t *testing.T) {
	var buf syncBuffer
	store.RouteRedisLogs(slog.New(slog.NewJSONHandler(&buf, nil)).With("service", "test"))
	t.Cleanup(func() {
		store.RouteRedisLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	})

	if _, err := store.OpenRedis(context.Background(), store.RedisOptions{Addr: freeAddr(t)}); err == nil {
		t.Fatal("OpenRedis of an address nothing listens on succeeded")
	}
	out := buf.String()
	if !strings.Contains(out, "redis client") {
		t.Fatalf("no go-redis record in the log; got %q", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if rec["level"] != "WARN" || rec["service"] != "test" || !strings.Contains(rec["detail"].(string), "connection refused") {
			t.Errorf("record %v; want a WARN of service test naming the refused connection", rec)
		}
	}
}
