//go:build unix

package agentrunner_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// TestIntakeRefusesIrregularInput: over gRPC, the shipped intake stage reads its raw_ticket
// without following links and only from a regular file. A link to a ticket outside the root
// (its sha256 recorded, so only the reader can stop it) and a FIFO (which hung the stage for
// its whole timeout) both fail the stage at once, naming what the input is.
func TestIntakeRefusesIrregularInput(t *testing.T) {
	ticket := support.SampleTicket()
	sum := sha256.Sum256(ticket)
	for name, c := range map[string]struct {
		place func(t *testing.T, path string)
		what  string
	}{
		"link": {func(t *testing.T, path string) {
			outside := filepath.Join(t.TempDir(), "ticket.json")
			if err := os.WriteFile(outside, ticket, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, path); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		"fifo": {func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "is a named pipe (FIFO)"},
	} {
		t.Run(name, func(t *testing.T) {
			e := start(t, agentrunner.Options{Agents: support.Agents(), StageTimeout: time.Minute}, "")
			in, err := e.arts.Put(context.Background(), artifact.Ref{JobID: "job-1", Stage: "input", Type: support.TypeRawTicket, SchemaVersion: support.SchemaRawTicket, MediaType: support.MediaJSON}, []byte("{}"))
			if err != nil {
				t.Fatal(err)
			}
			path := strings.TrimPrefix(in.GetUri(), "file://")
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			c.place(t, path)
			in.Sha256 = hex.EncodeToString(sum[:])
			p := pkg("intake")
			p.Artifacts = []*handoffv1.Artifact{in}

			begin := time.Now()
			msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
			if err != nil {
				t.Fatalf("Deliver: %v (after %s)", err, time.Since(begin))
			}
			if took := time.Since(begin); took > 5*time.Second {
				t.Fatalf("Deliver took %s", took)
			}
			if len(msgs) != 2 {
				t.Fatalf("messages %v, want the ack and a result", msgs)
			}
			res := msgs[1].GetResult()
			if res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_FAILED || !strings.Contains(res.GetError(), c.what) {
				t.Fatalf("result %s %q, want FAILED saying the input %s", res.GetStatus(), res.GetError(), c.what)
			}
			if strings.Contains(strings.ReplaceAll(res.GetError(), in.GetUri(), ""), e.arts.Root()) {
				t.Fatalf("error %q names the artifact root beyond the URI sent", res.GetError())
			}
		})
	}
}
