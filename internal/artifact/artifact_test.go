package artifact_test

import (
	"context"
	"fmt"
	"strings"
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

// TestWithCompletionKeepsEachVisit: a stage a route sends the job back to stores its artifact
// in a folder of its own per visit (and per return), so the earlier visit's artifact, whose
// sha256 a package may still carry, is never overwritten.
func TestWithCompletionKeepsEachVisit(t *testing.T) {
	files, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ref := artifact.Ref{JobID: "job-1", Stage: "intake", Type: "intake", SchemaVersion: "intake.v1", MediaType: "application/json"}
	if same := artifact.WithCompletion(files, 0, 0); same != artifact.Store(files) {
		t.Fatalf("WithCompletion(st, 0, 0) = %T, want st itself", same)
	}
	var uris []string
	for _, c := range []struct{ returns, visit uint32 }{{0, 0}, {0, 1}, {2, 1}} {
		a, err := artifact.WithCompletion(files, c.returns, c.visit).Put(ctx, ref, []byte(fmt.Sprint(c)))
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, a.GetUri())
	}
	for i, want := range []string{"/job-1/intake-r0/", "/job-1/intake-r0-v1/", "/job-1/intake-r0-o2-v1/"} {
		if !strings.Contains(uris[i], want) {
			t.Errorf("uri %d = %s, want it in %s", i, uris[i], want)
		}
	}
	first, err := files.Get(ctx, uris[0])
	if err != nil || string(first) != fmt.Sprint(struct{ returns, visit uint32 }{0, 0}) {
		t.Fatalf("first visit's artifact = %q, %v; want it untouched", first, err)
	}
}
