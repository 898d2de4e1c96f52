package coordinator_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
)

// TestLinkedInputIsNotShown: a symbolic link placed in the artifacts folder as a job's input
// (pointing at a file outside the root, its sha256 recorded) is read neither by intake nor
// by the operator page's Proposed artifact, which goes through the same reader: the page
// gets an error saying it is a link, never the file's bytes.
func TestLinkedInputIsNotShown(t *testing.T) {
	e := start(t, 10, 2, nil, nil) // shipped support pipeline and agents
	secret := []byte("root:x:0:0:root:/root:/bin/bash\n")
	outside := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(outside, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	path := strings.TrimPrefix(e.input.GetUri(), "file://")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, path); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(secret)
	e.input.Sha256 = hex.EncodeToString(sum[:])

	job, evs := e.submit(t, "support-ticket", "tkt_1", "", e.defaultBudget)
	if job.GetState() == handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("run completed from a linked input; timeline %v", kinds(evs))
	}
	art, data, err := e.st.Coordinator.Proposed(context.Background(), job)
	if art.GetUri() != e.input.GetUri() {
		t.Fatalf("proposed artifact %s, want the linked input %s", art.GetUri(), e.input.GetUri())
	}
	if data != nil || !errors.Is(err, artifact.ErrNotRegular) || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Proposed = %q, %v; want no bytes and an error saying it is a link", data, err)
	}
	for _, ev := range evs {
		if strings.Contains(ev.String(), "root:x:0:0") {
			t.Fatalf("event %s carries the linked file's text", ev.GetKind())
		}
	}
}
