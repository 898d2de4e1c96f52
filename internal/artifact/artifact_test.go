package artifact_test

import (
	"context"
	"testing"

	"github.com/handoffhq/handoff/internal/artifact"
)

// TestWithReturnsKeepsTheReplacedRun: a stage re-run after a person sent the job back stores
// its artifact beside the first run's, in the same judge round, instead of over it.
func TestWithReturnsKeepsTheReplacedRun(t *testing.T) {
	ctx := context.Background()
	files, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ref := artifact.Ref{JobID: "tkt_1", Stage: "draft", Type: "note", SchemaVersion: "note.v1", MediaType: "text/plain"}
	first, err := files.Put(ctx, ref, []byte("first run"))
	if err != nil {
		t.Fatal(err)
	}
	if same := artifact.WithReturns(files, 0); same != artifact.Store(files) {
		t.Fatalf("WithReturns(st, 0) = %T, want st itself", same)
	}
	var uris []string
	for _, returns := range []uint32{1, 2} {
		a, err := artifact.WithReturns(files, returns).Put(ctx, ref, []byte("re-run"))
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, a.GetUri())
	}
	if uris[0] == first.GetUri() || uris[1] == first.GetUri() || uris[0] == uris[1] {
		t.Fatalf("URIs %s, %v: want three different places", first.GetUri(), uris)
	}
	if got, err := files.Get(ctx, first.GetUri()); err != nil || string(got) != "first run" {
		t.Fatalf("first run's artifact = %q, %v; want it untouched", got, err)
	}
	if got, err := files.Get(ctx, uris[1]); err != nil || string(got) != "re-run" {
		t.Fatalf("re-run's artifact = %q, %v", got, err)
	}
}
