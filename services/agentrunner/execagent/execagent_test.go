package execagent_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/execagent"
)

func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func input(t *testing.T) agentrunner.Input {
	t.Helper()
	st, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return agentrunner.Input{
		Package: &handoffv1.HandoffPackage{
			Schema: "handoff.v1", JobId: "job-1", Stage: "draft", Goal: "g",
			Budget: &handoffv1.Budget{UsdRemainingMicros: 10, HopsRemaining: 1},
			Evaluator: &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1,
				Failures: []*handoffv1.Failure{{Code: "citation_missing"}}},
		},
		Round:     1,
		Artifacts: st,
	}
}

func run(t *testing.T, body string, timeout time.Duration, env ...string) (*handoffv1.StageResult, error) {
	t.Helper()
	a, err := execagent.New(agentrunner.RoleCard{Name: "draft"}, []string{"/bin/sh", script(t, body)}, timeout, env)
	if err != nil {
		t.Fatal(err)
	}
	return a.Run(context.Background(), input(t))
}

func TestGoodOutput(t *testing.T) {
	t.Setenv("RUNNER_SECRET", "s3cret")
	res, err := run(t, `
in=$(cat)
# the package arrives as protojson with proto names
echo "$in" | grep -q 'job-1' || { echo "no job id on stdin" >&2; exit 4; }
echo "$in" | grep -q 'last_verdict' || { echo "not proto names" >&2; exit 5; }
cat <<JSON
{"stage": "draft", "spent_usd_micros": "2500", "next_hint": "$HANDOFF_JOB_ID/$HANDOFF_STAGE/$HANDOFF_ROUND/$GREETING/${RUNNER_SECRET}",
 "artifacts": [{"type": "summary_md", "schema_version": "summary_md.v1", "uri": "file://$HANDOFF_ARTIFACTS_DIR/x.md"}],
 "tools_tried": [{"name": "kb.search", "ok": true}]}
JSON`, time.Second, "GREETING=hi")
	if err != nil {
		t.Fatal(err)
	}
	if res.SpentUsdMicros != 2500 || len(res.Artifacts) != 1 || res.Stage != "draft" || len(res.ToolsTried) != 1 {
		t.Fatalf("result %v", res)
	}
	if res.NextHint != "job-1/draft/1/hi/" {
		t.Fatalf("environment seen by the program: %q (the runner's own env must not leak)", res.NextHint)
	}
	if !strings.HasPrefix(res.Artifacts[0].Uri, "file:///") {
		t.Errorf("artifact uri %q: HANDOFF_ARTIFACTS_DIR not set", res.Artifacts[0].Uri)
	}
}

func TestFailures(t *testing.T) {
	big := strings.Repeat("e", 9000) + "LAST-LINE"
	for _, tc := range []struct {
		name, body string
		want       []string
		not        []string
	}{
		{"garbage", `cat >/dev/null; echo "this is not json"`, []string{"not one StageResult"}, nil},
		{"empty", `cat >/dev/null`, []string{"no StageResult"}, nil},
		{"unknown field", `cat >/dev/null; echo '{"verdict": "pass"}'`, []string{"not one StageResult", "verdict"}, nil},
		{"two results", `cat >/dev/null; echo '{}'; echo '{}'`, []string{"not one StageResult"}, nil},
		{"non-zero exit", `cat >/dev/null; echo "model quota exhausted" >&2; exit 3`, []string{"exit status 3", "model quota exhausted"}, nil},
		{"mismatched job_id", `cat >/dev/null; echo '{"job_id": "job-2"}'`, []string{`job_id "job-2"`, `"job-1"`}, nil},
		{"mismatched stage", `cat >/dev/null; echo '{"stage": "judge"}'`, []string{`stage "judge"`}, nil},
		{"invalid result", `cat >/dev/null; echo '{"spent_usd_micros": -1}'`, []string{"invalid", "spent_usd_micros"}, nil},
		{"invalid artifact", `cat >/dev/null; echo '{"artifacts": [{"type": "Bad Type", "schema_version": "x.v1", "uri": "file:///x"}]}'`, []string{"invalid", "artifacts[0].type"}, nil},
		{"stdout too large", `cat >/dev/null; head -c 1100000 /dev/zero | tr '\0' 'a'`, []string{"larger than 1048576"}, nil},
		{"stderr tail", `cat >/dev/null; printf '` + big + `' >&2; exit 1`, []string{"LAST-LINE", "exit status 1"}, []string{strings.Repeat("e", 4200)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, tc.body, 5*time.Second)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %.300q does not mention %q", err, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error carries more than the stderr tail (%d bytes)", len(err.Error()))
				}
			}
		})
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "child.pid")
	start := time.Now()
	_, err := run(t, `cat >/dev/null; echo started >&2; sleep 30 & echo $! > `+pidfile+`; wait`, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "started") {
		t.Fatalf("err %v, want a timeout with stderr", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("took %s: the run was not cut at the timeout", d)
	}
	data, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	deadline := time.Now().Add(3 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return // gone, or a zombie waiting for its reaper: killed either way
		}
		if time.Now().After(deadline) {
			t.Fatalf("the script's child (pid %d) survived the timeout: %s", pid, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCancelledContext(t *testing.T) {
	a, err := execagent.New(agentrunner.RoleCard{Name: "draft"}, []string{"/bin/sh", script(t, `sleep 30`)}, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := a.Run(ctx, input(t)); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("err %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	card := agentrunner.RoleCard{Name: "draft"}
	if _, err := execagent.New(card, nil, 0, nil); err == nil {
		t.Error("empty argv accepted")
	}
	if _, err := execagent.New(card, []string{"/no/such/program"}, 0, nil); err == nil {
		t.Error("missing program accepted")
	}
	if _, err := execagent.New(card, []string{"/bin/sh"}, 0, []string{"NOEQUALS"}); err == nil {
		t.Error("bad env accepted")
	}
	if _, err := execagent.New(agentrunner.RoleCard{}, []string{"/bin/sh"}, 0, nil); err == nil {
		t.Error("nameless card accepted")
	}
}

// TestEnvironmentAfterAReturn: a stage a person sent the job back to runs with its return
// count in HANDOFF_OPERATOR_RETURNS, and still finds the artifact folder behind the store
// the runner wraps for it (artifact.WithReturns).
func TestEnvironmentAfterAReturn(t *testing.T) {
	a, err := execagent.New(agentrunner.RoleCard{Name: "draft"}, []string{"/bin/sh", script(t, `cat >/dev/null
echo "{\"next_hint\": \"$HANDOFF_OPERATOR_RETURNS|$HANDOFF_ARTIFACTS_DIR\"}"`)}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := input(t)
	files := in.Artifacts.(*artifact.Files)
	in.Package.OperatorReturns = 2
	in.Artifacts = artifact.WithReturns(files, 2)
	res, err := a.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if want := "2|" + files.Root(); res.GetNextHint() != want {
		t.Fatalf("environment: %q; want %q", res.GetNextHint(), want)
	}
}

// TestEnvironmentOfARoutedStage: a program serving a stage with routes finds their names in
// HANDOFF_ROUTES and a repeated visit in HANDOFF_VISIT, and may answer with a route.
func TestEnvironmentOfARoutedStage(t *testing.T) {
	a, err := execagent.New(agentrunner.RoleCard{Name: "intake"}, []string{"/bin/sh", script(t, `cat >/dev/null
echo "{\"next_hint\": \"$HANDOFF_VISIT|$HANDOFF_ROUTES\", \"route\": {\"name\": \"billing\", \"priority\": \"ROUTE_PRIORITY_HIGH\"}}"`)}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := input(t)
	in.Package.Visit = 1
	in.Routes = []*handoffv1.RouteOption{{Name: "billing"}, {Name: "unclear"}}
	res, err := a.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetNextHint() != "1|billing,unclear" || res.GetRoute().GetName() != "billing" || res.GetRoute().GetPriority() != handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH {
		t.Fatalf("result %v; want hint 1|billing,unclear and route billing (HIGH)", res)
	}
}
