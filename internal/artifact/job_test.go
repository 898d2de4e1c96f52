package artifact_test

import (
	"context"
	"testing"

	"github.com/handoffhq/handoff/internal/artifact"
)

// TestInJobFolder: only a file:// path strictly inside root/<job_id> is the job's; any way
// out of it (another job, the root, .., percent-encoded .., a host, another scheme) is not.
func TestInJobFolder(t *testing.T) {
	root := "/srv/artifacts"
	files, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, err := files.Put(context.Background(), artifact.Ref{JobID: "tkt_1", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if !artifact.InJobFolder(files.Root(), "tkt_1", a.GetUri()) {
		t.Fatalf("what Put stored for tkt_1 (%s) is not in tkt_1's folder", a.GetUri())
	}
	if artifact.InJobFolder(files.Root(), "tkt_2", a.GetUri()) {
		t.Fatalf("tkt_1's artifact counts as tkt_2's")
	}
	for uri, want := range map[string]bool{
		"file:///srv/artifacts/tkt_1/submit-r0/raw_ticket.json":               true,
		"file:///srv/artifacts/tkt_1/x":                                       true,
		"file:///srv/artifacts/tkt_1":                                         false, // the folder itself
		"file:///srv/artifacts/tkt_10/x":                                      false, // a job whose id starts alike
		"file:///srv/artifacts/tkt_2/submit-r0/raw_ticket.json":               false,
		"file:///srv/artifacts/x":                                             false,
		"file:///srv/artifacts/tkt_1/../tkt_2/x":                              false,
		"file:///srv/artifacts/tkt_1/%2e%2e/%2e%2e/%2e%2e/etc/passwd":         false,
		"file:///etc/passwd":                                                  false,
		"file://evil/srv/artifacts/tkt_1/x":                                   false,
		"file:srv/artifacts/tkt_1/x":                                          false,
		"https://example.com/srv/artifacts/tkt_1/x":                           false,
		"/srv/artifacts/tkt_1/x":                                              false,
		"file:///srv/artifacts/tkt_1/sub/../still-inside.json":                true,
		"file:///srv/artifacts/tkt_1/sub/../../tkt_1/ok.json":                 true,
		"file:///srv/artifacts/tkt_1/sub/../../../../srv/artifacts/tkt_1/x.j": true,
	} {
		if got := artifact.InJobFolder(root, "tkt_1", uri); got != want {
			t.Errorf("InJobFolder(%s, tkt_1, %s) = %v, want %v", root, uri, got, want)
		}
	}
	for _, job := range []string{"", "..", "a/b", "../srv"} {
		if artifact.InJobFolder(root, job, "file:///srv/artifacts/tkt_1/x") {
			t.Errorf("job id %q matched", job)
		}
	}
	if artifact.InJobFolder("", "tkt_1", "file:///tkt_1/x") {
		t.Error("an empty root matched")
	}
}
