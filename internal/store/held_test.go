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
	_, path := openFirst(t)
	_, err := Open(path)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "another process holds the store") || !strings.Contains(err.Error(), "same folder") {
		t.Fatalf("second Open = %v; want ErrHeld saying another process holds the store", err)
	}
}

// openFirst opens a fresh bbolt file, closed when the test ends, and makes a second Open of
// it give up waiting for the file's lock after 200 ms instead of the default wait.
func openFirst(t *testing.T) (*Bolt, string) {
	t.Helper()
	w := lockWait
	lockWait = 200 * time.Millisecond
	t.Cleanup(func() { lockWait = w })
	path := filepath.Join(t.TempDir(), "handoff.db")
	first, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	return first, path
}
