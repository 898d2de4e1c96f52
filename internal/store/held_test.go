package store

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second opener of a bbolt file says another process holds it, not "timeout".
func TestOpenHeldStoreSaysSo(t *testing.T) {
	defer func(w time.Duration) { lockWait = w }(lockWait)
	lockWait = 200 * time.Millisecond
	path := filepath.Join(t.TempDir(), "handoff.db")
	first, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = Open(path)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "another process holds the store") || !strings.Contains(err.Error(), "same folder") {
		t.Fatalf("second Open = %v; want ErrHeld saying another process holds the store", err)
	}
}
