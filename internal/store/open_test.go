package store_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/store"
)

func TestOpenURL(t *testing.T) {
	s, err := store.OpenURL(context.Background(), filepath.Join(t.TempDir(), "sub", "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*store.Bolt); !ok {
		t.Fatalf("a path opened %T, want *store.Bolt", s)
	}
	s.Close()
	for _, bad := range []string{"redis://", "redis://127.0.0.1:6379/zero"} {
		if _, err := store.OpenURL(context.Background(), bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("OpenURL(%q) = %v, want an error naming it", bad, err)
		}
	}
	if _, err := store.OpenURL(context.Background(), "redis://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("OpenURL(closed port) = %v, want an error naming the address", err)
	}
}
