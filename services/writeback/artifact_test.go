//go:build unix

package writeback_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWriteRefusesIrregularArtifact: the artifact to write is read without following links
// and only if it is a regular file. A link to a file outside the root whose bytes match the
// recorded sha256 (so only the reader can stop it), and a FIFO that would block a reader
// until its timeout, are both refused at once with FailedPrecondition; nothing is written,
// the key is released, and the message does not name the artifact root beyond the URI.
func TestWriteRefusesIrregularArtifact(t *testing.T) {
	for name, place := range map[string]func(t *testing.T, e *env, path string){
		"link": func(t *testing.T, e *env, path string) {
			outside := filepath.Join(t.TempDir(), "reply.md")
			if err := os.WriteFile(outside, e.body, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, path); err != nil {
				t.Fatal(err)
			}
		},
		"fifo": func(t *testing.T, e *env, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			path := strings.TrimPrefix(e.art.GetUri(), "file://")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			place(t, e, path)
			start := time.Now()
			_, err := e.client.Write(ctxT(t), e.req())
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("Write took %s", took)
			}
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "regular file") {
				t.Fatalf("%v, want FailedPrecondition refusing a file that is not regular", err)
			}
			if errors.Is(err, os.ErrNotExist) {
				t.Fatal("refusal reads as not found")
			}
			if strings.Contains(strings.ReplaceAll(msg, e.art.GetUri(), ""), e.files.Root()) {
				t.Fatalf("message %q names the artifact root beyond the URI sent", msg)
			}
			if s := e.claimState(t, wantKey); s != 0 {
				t.Errorf("key is %s, want released", s)
			}
			if n := len(e.ledger(t)); n != 0 {
				t.Errorf("ledger has %d entries", n)
			}
		})
	}
}
