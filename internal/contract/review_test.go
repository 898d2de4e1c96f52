package contract_test

import (
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/testkit"
)

// Review: branch_results is "every completed branch's result, keyed by branch" (fanout.go).
// A package naming one branch twice (two different results for branch "web") is valid, so a
// merge stage cannot tell which is the branch's, and the runner's completion key
// (MergeKey) digests both: a forged or doubled set merges again as a new stage run.
func TestReviewBranchResultsKeyedByBranch(t *testing.T) {
	v, err := contract.NewValidator("handoff.v1")
	if err != nil {
		t.Fatal(err)
	}
	art := func(uri string) []*handoffv1.Artifact {
		return []*handoffv1.Artifact{{Type: "note", SchemaVersion: "note.v1", Uri: uri}}
	}
	p := testkit.Package(func(p *handoffv1.HandoffPackage) {
		p.BranchResults = []*handoffv1.BranchResult{
			{Branch: "web", Artifacts: art("file:///a/web-1.md")},
			{Branch: "web", Artifacts: art("file:///a/web-2.md")},
		}
	})
	if err := v.Validate(p); err == nil {
		t.Errorf("a package naming branch %q twice in branch_results is valid", "web")
	}
}
