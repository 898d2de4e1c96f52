package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestRunSchema(t *testing.T) {
	for _, tc := range []struct {
		args []string
		id   string
	}{
		{[]string{"handoff.v1"}, "handoff.v1.HandoffPackage.schema.bundle.json"},
		{[]string{"handoff.v2"}, "handoff.v2.HandoffPackage.schema.bundle.json"},
		{[]string{"handoff.v1.Ack"}, "handoff.v1.Ack.schema.bundle.json"},
		{[]string{"handoff.v2.HandoffPackage"}, "handoff.v2.HandoffPackage.schema.bundle.json"},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := runSchema(tc.args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			var doc struct {
				ID     string `json:"$id"`
				Schema string `json:"$schema"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
				t.Fatalf("output is not JSON: %v", err)
			}
			if doc.ID != tc.id || !strings.Contains(doc.Schema, "2020-12") {
				t.Fatalf("$id %q $schema %q, want %q and Draft 2020-12", doc.ID, doc.Schema, tc.id)
			}
		})
	}
}

func TestRunSchemaErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown version", []string{"handoff.v9"}, []string{`"handoff.v9"`, "handoff.v1", "handoff.v2"}},
		{"path escape", []string{"../handoff.v1"}, []string{"handoff.v1", "handoff.v2"}},
		{"no name", nil, []string{"exactly one NAME"}},
		{"two names", []string{"handoff.v1", "handoff.v2"}, []string{"exactly one NAME"}},
		{"bad flag", []string{"--yaml", "handoff.v1"}, []string{"Usage:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := runSchema(tc.args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2", code)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q lacks %q", stderr.String(), w)
				}
			}
		})
	}
}

func TestRunSchemaListAndHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runSchema([]string{"--list"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--list: exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	for _, want := range []string{"handoff.v1", "handoff.v2", "handoff.v1.HandoffPackage", "handoff.v2.MemoryRef"} {
		found := false
		for _, l := range lines {
			found = found || l == want
		}
		if !found {
			t.Errorf("--list lacks %s", want)
		}
	}
	stdout.Reset()
	if code := runSchema([]string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "handoff.v1") {
		t.Fatalf("--help: exit %d, %q", code, stdout.String())
	}
}
