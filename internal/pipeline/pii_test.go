package pipeline

import (
	"path/filepath"
	"testing"

	"github.com/handoffhq/handoff/internal/pii"
)

func TestPIIBlock(t *testing.T) {
	p, err := Load(filepath.Join("testdata", "pii.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.PIIPolicy() != PIIRedact || len(p.PII.Patterns) != 1 || p.PII.Patterns[0] != (pii.Pattern{Name: "employee_id", Regex: `\bEMP-\d{3}-\d{4}\b`}) {
		t.Fatalf("pii = %+v, policy %q", p.PII, p.PIIPolicy())
	}
	d, err := p.PIIDetector()
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := d.First("ask EMP-204-7781"); !ok || k != "employee_id" {
		t.Errorf("the pipeline's detector finds %q %v, want employee_id", k, ok)
	}

	// Without a pii block: reject, built-in detectors only.
	good, err := Load(filepath.Join("testdata", "good.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if good.PIIPolicy() != PIIReject || len(good.PII.Patterns) != 0 {
		t.Errorf("default pii = %+v, policy %q, want reject and no patterns", good.PII, good.PIIPolicy())
	}

	// A pipeline built in code with a broken pattern has no detector.
	bad := &Pipeline{PII: PII{Patterns: []pii.Pattern{{Name: "x", Regex: "("}}}}
	if _, err := bad.PIIDetector(); err == nil {
		t.Error("PIIDetector with a broken pattern = nil error")
	}
}
