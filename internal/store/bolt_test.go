package store_test

import (
	"path/filepath"
	"testing"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

func TestBolt(t *testing.T) {
	open := func(t *testing.T) store.Store {
		s, err := store.Open(filepath.Join(t.TempDir(), "handoff.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	storetest.Run(t, open)
	t.Run("CreateRunLeased", func(t *testing.T) { storetest.CreateRunLeased(t, open(t)) })
}
