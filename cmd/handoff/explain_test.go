package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
)

var update = flag.Bool("update", false, "rewrite the golden files of the tests that have one")

// TestDemoExplainGolden: `handoff demo --explain` prints the explanation of the demo's
// first run, five answers per hop and no package, exactly as testdata/demo_explain.golden
// has it (the run id and the data folder replaced). go test -run TestDemoExplainGolden
// -update rewrites the file after a deliberate change.
func TestDemoExplainGolden(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", dir, "--explain"}, &out, &errb); code != 0 {
		t.Fatalf("demo --explain exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	i := strings.Index(text, "\nexplain run_")
	if i < 0 {
		t.Fatalf("no explanation in the output:\n%s", text)
	}
	got := text[i+1:]
	got = strings.ReplaceAll(got, dir, "$DATA")
	got = regexp.MustCompile(`run_[0-9a-f]{28}`).ReplaceAllString(got, "run_ID")
	golden := filepath.Join("testdata", "demo_explain.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("demo --explain differs from %s:\n got:\n%s\nwant:\n%s", golden, got, want)
	}
	// Five answers on each of the seven hops, and nothing of what the packages said.
	answers := regexp.MustCompile(`(?m)^ {1,4}\d* .*(same job_id|required field|evaluator|burned tools|artifacts read) +(OK|VIOLATION|N/A|UNKNOWN) `).FindAllString(got, -1)
	if len(answers) != 7*5 {
		t.Errorf("%d answers, want 35 (five for each of 7 hops)", len(answers))
	}
	for _, said := range []string{"Draft internal triage summary", "no refund promises", "customer_id:cus_9", "timezone"} {
		if strings.Contains(got, said) {
			t.Errorf("the explanation prints package content %q", said)
		}
	}
}

// explainStack runs the platform with an operator token and the demo's job on it.
func explainStack(t *testing.T) (st *stack.Stack, token, runID string) {
	t.Helper()
	token = "explain-operator-token-0123456789"
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		OperatorToken: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	res, err := demo.Run(context.Background(), io.Discard, cc, st.Artifacts)
	if err != nil {
		t.Fatal(err)
	}
	return st, token, res.First.GetRunId()
}

func explain(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(append([]string{"explain"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// handoff explain against a running coordinator: the table, and --json.
func TestExplainCommand(t *testing.T) {
	st, token, runID := explainStack(t)
	id := []string{"--coordinator", st.CoordinatorAddr, "--plaintext-loopback", "--operator-token", token}
	code, out, errs := explain(append(id, runID)...)
	if code != 0 || !strings.HasPrefix(out, "explain "+runID+"  job tkt_18422  pipeline support-ticket  COMPLETED") || !strings.Contains(out, "violations: none") {
		t.Fatalf("explain = %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = explain(append(id, "--json", runID)...)
	var ex struct {
		RunID string `json:"runId"`
		Hops  []struct {
			Answers []struct {
				Finding string `json:"finding"`
			} `json:"answers"`
		} `json:"hops"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &ex) != nil || ex.RunID != runID || len(ex.Hops) != 7 {
		t.Fatalf("explain --json = %d %+v\n%s\n%s", code, ex, out, errs)
	}
	for i, h := range ex.Hops {
		if len(h.Answers) != 5 {
			t.Errorf("hop %d: %d answers, want 5", i+1, len(h.Answers))
		}
	}
}

// Bad input is refused before any call, naming what is wrong; a caller without an identity,
// or with a wrong token, is refused by the coordinator; an unknown run is NotFound.
func TestExplainRefuses(t *testing.T) {
	st, token, _ := explainStack(t)
	addr := []string{"--coordinator", st.CoordinatorAddr}
	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no run id", append(addr, "--plaintext-loopback", "--operator-token", token), 2, "exactly one RUN_ID"},
		{"two run ids", append(addr, "--plaintext-loopback", "--operator-token", token, "run_0123456789abcdef", "run_0123456789abcdee"), 2, "exactly one RUN_ID"},
		{"bad run id", append(addr, "--plaintext-loopback", "--operator-token", token, "../etc/passwd"), 2, `RUN_ID "../etc/passwd" is not a run id`},
		{"unknown flag", append(addr, "--colour", "run_0123456789abcdef"), 2, "flag provided but not defined: -colour"},
		{"no transport security", append(addr, "run_0123456789abcdef"), 2, "--certs DIR or --plaintext-loopback"},
		{"unknown run", append(addr, "--plaintext-loopback", "--operator-token", token, "run_0123456789abcdef"), 1, `NotFound: run "run_0123456789abcdef" not found`},
		{"unknown time-ordered run", append(addr, "--plaintext-loopback", "--operator-token", token, "run_01a2336840800123456789abcdef"), 1, `NotFound: run "run_01a2336840800123456789abcdef" not found`},
		{"unknown nested run", append(addr, "--plaintext-loopback", "--operator-token", token, "run_01a2336840800123456789abcdef-look-up-2-deep_er-1"), 1, `NotFound: run "run_01a2336840800123456789abcdef-look-up-2-deep_er-1" not found`},
		{"run id of 20 hex digits", append(addr, "--plaintext-loopback", "--operator-token", token, "run_0123456789abcdef0123"), 2, `RUN_ID "run_0123456789abcdef0123" is not a run id`},
		{"nested run without its number", append(addr, "--plaintext-loopback", "--operator-token", token, "run_0123456789abcdef-look"), 2, `RUN_ID "run_0123456789abcdef-look" is not a run id`},
		{"run id in uppercase hex", append(addr, "--plaintext-loopback", "--operator-token", token, "run_01A2336840800123456789ABCDEF"), 2, `RUN_ID "run_01A2336840800123456789ABCDEF" is not a run id`},
		{"run id with a trailing newline", append(addr, "--plaintext-loopback", "--operator-token", token, "run_01a2336840800123456789abcdef\n"), 2, `RUN_ID "run_01a2336840800123456789abcdef\n" is not a run id`},
		{"nested run with an empty stage", append(addr, "--plaintext-loopback", "--operator-token", token, "run_01a2336840800123456789abcdef--1"), 2, `RUN_ID "run_01a2336840800123456789abcdef--1" is not a run id`},
		{"nested run under a traversal", append(addr, "--plaintext-loopback", "--operator-token", token, "run_01a2336840800123456789abcdef-a-1/../x"), 2, `is not a run id`},
		{"caller without identity", append(addr, "--plaintext-loopback", "run_0123456789abcdef"), 1, "Unauthenticated"},
		{"wrong operator token", append(addr, "--plaintext-loopback", "--operator-token", "not-the-operator-token-at-all", "run_0123456789abcdef"), 1, "Unauthenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := explain(tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.says) || out != "" {
				t.Errorf("explain %v = %d\nstdout %q\nstderr %q; want %d saying %q", tc.args, code, out, errs, tc.code, tc.says)
			}
		})
	}
}
