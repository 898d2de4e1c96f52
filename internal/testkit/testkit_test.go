package testkit_test

import (
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
)

// rec records failures instead of failing the test that runs it.
type rec struct {
	testing.TB
	errs []string
}

func (r *rec) Helper()                   {}
func (r *rec) Errorf(f string, a ...any) { r.errs = append(r.errs, f) }

func TestDiffShowsTheField(t *testing.T) {
	a := testkit.Package()
	b := testkit.Package(testkit.AtStage("judge"))
	if d := testkit.Diff(a, testkit.Package()); d != "" {
		t.Errorf("two new packages differ: %s", d)
	}
	d := testkit.Diff(a, b)
	if !strings.Contains(d, "stage") || !strings.Contains(d, "judge") {
		t.Errorf("Diff = %q; want it to name stage and the new value", d)
	}
	r := &rec{TB: t}
	if testkit.Equal(r, b, a, "the package") || len(r.errs) != 1 {
		t.Errorf("Equal of different packages = true or reported %d times", len(r.errs))
	}
}

func TestPackageIsFreshAndValid(t *testing.T) {
	p := testkit.Package(testkit.OfJob("j"), testkit.Passed(), testkit.WithBudget(&handoffv1.Budget{HopsRemaining: 1}))
	if p.GetJobId() != "j" || p.GetEvaluator().GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS || p.GetBudget().GetHopsRemaining() != 1 {
		t.Errorf("mods not applied: %v", p)
	}
	q := testkit.Package()
	q.Budget.HopsRemaining = 99
	if testkit.Package().GetBudget().GetHopsRemaining() == 99 {
		t.Error("packages share their budget")
	}
}
