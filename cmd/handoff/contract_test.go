package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// checkData runs `handoff contract check-data` and returns its exit code and output.
func checkData(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"contract", "check-data"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// assertCheckData checks the demo's two runs in the store at url: the complying rule passes
// (exit 0), the tighter one is refused (exit 1) with each violation on a line naming the
// run and the field path: per run the two "verdict" artifacts and the FAIL verdict.
func assertCheckData(t *testing.T, url string) {
	t.Helper()
	code, out, errs := checkData(t, "--store", url, "--rule", filepath.Join("testdata", "candidates", "complies.proto"))
	if code != 0 || !strings.Contains(out, "the stored data complies with candidate.HandoffPackage (2 runs") {
		t.Fatalf("complying rule: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = checkData(t, "--store", url, "--rule", filepath.Join("testdata", "candidates", "tighter.proto"))
	if code != 1 {
		t.Fatalf("tighter rule: exit %d, want 1\n%s%s", code, out, errs)
	}
	line := regexp.MustCompile(`(?m)^run (run_[0-9a-f]+) job tkt_18422: (\S+) = "([^"]*)": .* \[(\S+)\]$`)
	got := map[string][]string{}
	for _, m := range line.FindAllStringSubmatch(out, -1) {
		got[m[1]] = append(got[m[1]], m[2]+"="+m[3]+" "+m[4])
	}
	want := "artifacts[4].type=verdict string.in|artifacts[6].type=verdict string.in|evaluator.last_verdict=VERDICT_FAIL enum.in"
	if len(got) != 2 {
		t.Fatalf("violations of %d runs, want the demo's 2:\n%s", len(got), out)
	}
	for run, vs := range got {
		if strings.Join(vs, "|") != want {
			t.Errorf("run %s: %q, want %q", run, strings.Join(vs, "|"), want)
		}
	}
	if !strings.Contains(out, "6 stored values break candidate.HandoffPackage") {
		t.Errorf("no summary of 6 values:\n%s", out)
	}
}

// On the bbolt store of `handoff demo --data DIR`.
func TestContractCheckDataBolt(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", dir}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d: %s", code, errb.String())
	}
	assertCheckData(t, filepath.Join(dir, "handoff.db"))
}

// On the real Redis, with the demo's runs written by the stack sharing it.
func TestContractCheckDataRedis(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	st, err := stack.Start(context.Background(), stack.Config{
		DataDir: t.TempDir(), Store: storetest.OpenRedisPrefix(t, prefix),
		CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := demo.Run(context.Background(), io.Discard, cc, st.Artifacts); err != nil {
		t.Fatal(err)
	}
	st.Close()
	assertCheckData(t, "redis://"+storetest.RedisAddr()+"?prefix="+prefix)
}

// Bad input is named: a missing flag, a rule file that does not compile, a message it lacks.
func TestContractCheckDataRefuses(t *testing.T) {
	db := filepath.Join(t.TempDir(), "handoff.db")
	bad := filepath.Join(t.TempDir(), "bad.proto")
	mustWrite(t, bad, "syntax = \"proto3\";\nmessage HandoffPackage { string goal = 4 [(buf.validate.field).string.min_len = 1]; }\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", db}, "--rule is required"},
		{[]string{"--rule", "testdata/candidates/complies.proto"}, "--store is required"},
		{[]string{"--store", db, "--rule", "testdata/candidates/nope.proto"}, "nope.proto"},
		{[]string{"--store", db, "--rule", bad}, "bad.proto"},
		{[]string{"--store", db, "--rule", "testdata/candidates/complies.proto", "--message", "Other"}, `"Other"`},
	} {
		if code, _, errs := checkData(t, c.args...); code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", c.args, code, errs, c.want)
		}
	}
}

func mustWrite(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
