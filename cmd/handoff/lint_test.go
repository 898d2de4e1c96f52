package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fixtures = "../../internal/pipeline/testdata"

func lintRun(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = runLint(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestLintExitCodesAndOutput(t *testing.T) {
	good := filepath.Join(fixtures, "good.yaml")
	twoWriters := filepath.Join(fixtures, "two_writers.yaml")
	structure := filepath.Join(fixtures, "structure.yaml")
	syntax := filepath.Join(fixtures, "syntax_error.yaml")
	sharedTool := filepath.Join(fixtures, "parallel_shared_write_tool.yaml")
	sharedOutput := filepath.Join(fixtures, "parallel_shared_output.yaml")

	dir := t.TempDir()
	warnOnly := filepath.Join(dir, "warn.yaml")
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	// A catalogue tool no stage holds: a warning, not an error.
	warnData := strings.Replace(string(data), "tools:\n", "tools:\n  - {name: kb.fetch, access: read, system: helpcenter}\n", 1)
	if err := os.WriteFile(warnOnly, []byte(warnData), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string // substrings, in order
		stdoutNot  []string
		stderr     string
		exactLines int // when > 0, stdout has exactly this many lines
	}{
		{name: "no args", args: nil, code: 2, stderr: "Usage: handoff lint"},
		{name: "help", args: []string{"-h"}, code: 0, stdout: []string{"Usage: handoff lint"}},
		{name: "bad flag", args: []string{"--nope", good}, code: 2, stderr: "flag provided but not defined"},
		{name: "clean", args: []string{good}, code: 0, stdout: []string{"ok: " + good + " (5 stages)\n"}, exactLines: 1},
		{name: "shipped", args: []string{"../../pipelines/support-ticket.yaml"}, code: 0,
			stdout: []string{"ok: ../../pipelines/support-ticket.yaml (5 stages)\n"}, exactLines: 1},
		{name: "one problem", args: []string{twoWriters}, code: 1, stdout: []string{
			twoWriters + `:41:22: one-writer: stages "writeback" (line 31) and "audit" both write to system crm`,
			"\n1 problem\n",
		}, stdoutNot: []string{"ok:"}, exactLines: 2},
		{name: "errors and warnings", args: []string{structure}, code: 1, stdout: []string{
			structure + ":2:7: pipeline-name: ",
			structure + ":10:12: unused-tool: warning: ",
			structure + ":17:11: duplicate-stage: ",
			"\n8 problems (1 warning)\n",
		}, exactLines: 9},
		{name: "warnings only", args: []string{warnOnly}, code: 0, stdout: []string{
			"unused-tool: warning: tool \"kb.fetch\"",
			"ok: " + warnOnly + " (5 stages)\n",
			"1 problem (1 warning)\n",
		}},
		{name: "syntax error", args: []string{syntax}, code: 1, stdout: []string{
			syntax + ":10:1: yaml-syntax: the file is not valid YAML",
			"\n1 problem\n",
		}},
		{name: "several files", args: []string{good, twoWriters}, code: 1, stdout: []string{
			"ok: " + good, twoWriters + ":41:22: one-writer:", "1 problem\n",
		}},
		{name: "same name twice", args: []string{good, good}, code: 1, stdout: []string{
			"ok: " + good, good + `:2:7: pipeline-name: pipeline "support-ticket" is also declared in ` + good,
		}},
		{name: "missing file", args: []string{filepath.Join(dir, "missing.yaml"), good}, code: 2,
			stdout: []string{"ok: " + good}, stderr: "missing.yaml"},
		{name: "directory", args: []string{fixtures}, code: 1, stdout: []string{
			"ok: " + good, "one-stage", "judge-no-write", "max-hops", "one-writer", "unknown-field", "artifact-version",
		}},
		// Fan-out: branches must be hard partitions.
		{name: "branches share a write tool", args: []string{sharedTool}, code: 1, stdout: []string{
			sharedTool + `:19:17: partition-write-tool: branch "history" of stage "lookups" owns write tool crm.patch, which branch "policy" also owns`,
		}, stdoutNot: []string{"ok:"}},
		{name: "branches share an output type", args: []string{sharedOutput}, code: 1, stdout: []string{
			sharedOutput + `:19:19: partition-output: branch "history" of stage "lookups" owns output type notes, which branch "policy" also owns`,
			"\n1 problem\n",
		}, stdoutNot: []string{"ok:"}, exactLines: 2},
		{name: "shipped research-brief", args: []string{"../../pipelines/research-brief.yaml"}, code: 0,
			stdout: []string{"ok: ../../pipelines/research-brief.yaml (4 stages)\n"}, exactLines: 1},
		{name: "empty directory", args: []string{t.TempDir()}, code: 2, stderr: "no *.yaml or *.yml files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := lintRun(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, stdout, stderr)
			}
			rest := stdout
			for _, want := range tt.stdout {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Errorf("stdout misses %q (in order):\n%s", want, stdout)
					break
				}
				rest = rest[i+len(want):]
			}
			for _, not := range tt.stdoutNot {
				if strings.Contains(stdout, not) {
					t.Errorf("stdout has %q:\n%s", not, stdout)
				}
			}
			if tt.exactLines > 0 && strings.Count(stdout, "\n") != tt.exactLines {
				t.Errorf("stdout has %d lines, want %d:\n%s", strings.Count(stdout, "\n"), tt.exactLines, stdout)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr misses %q:\n%s", tt.stderr, stderr)
			}
			if tt.stderr == "" && stderr != "" {
				t.Errorf("unexpected stderr:\n%s", stderr)
			}
		})
	}
}
