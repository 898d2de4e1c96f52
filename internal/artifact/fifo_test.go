//go:build unix

package artifact_test

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestGetRefusesFIFOAtOnce: a FIFO at an artifact's URI is refused without opening it, so a
// reader never blocks waiting for a writer (today's stage hung for its 60 s timeout).
func TestGetRefusesFIFOAtOnce(t *testing.T) {
	ctx := context.Background()
	f := newFiles(t)
	if _, err := f.Put(ctx, note, []byte("x")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(f.Root(), "tkt_1", "draft-r0", "pipe.txt")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	type got struct {
		data []byte
		err  error
	}
	done := make(chan got, 1)
	go func() {
		data, err := f.Get(ctx, fileURI(p))
		done <- got{data, err}
	}()
	select {
	case g := <-done:
		wantRefused(t, g.data, g.err, `"tkt_1/draft-r0/pipe.txt" is a named pipe (FIFO)`)
	case <-time.After(5 * time.Second):
		// Unblock the reader so the test binary can exit.
		if w, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			syscall.Close(w)
		}
		t.Fatal("Get on a FIFO still blocked after 5s")
	}
}
