package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/stack"
)

// recipe is one `# name` comment and the command under it in the README's recipe block.
type recipe struct{ name, cmd string }

func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

func readmeRecipes(t *testing.T, root string) []recipe {
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- recipes:begin -->\\s*```sh\\n(.*?)```\\s*<!-- recipes:end -->").FindSubmatch(data)
	if m == nil {
		t.Fatal("README.md has no recipes block")
	}
	var out []recipe
	var name string
	sc := bufio.NewScanner(strings.NewReader(string(m[1])))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "# "):
			name = strings.SplitN(strings.TrimPrefix(line, "# "), ":", 2)[0]
		case line != "":
			out = append(out, recipe{name, line})
		}
	}
	return out
}

func grpcurlPath(t *testing.T, root string) string {
	if p := filepath.Join(root, "bin", "grpcurl"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("grpcurl not found in bin/ or PATH: run `make tools`")
	}
	t.Skip("grpcurl not found: run `make tools` (installs v1.9.4 into bin/)")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestReadmeGrpcurlRecipes runs every grpcurl recipe of the README, as written, with the
// real grpcurl against services started here, and checks what each is documented to show.
func TestReadmeGrpcurlRecipes(t *testing.T) {
	root := repoRoot(t)
	grpcurl := grpcurlPath(t, root)
	const token = "recipes-operator-token"
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		OperatorToken: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	env := append(os.Environ(), "PATH="+filepath.Dir(grpcurl)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"COORD="+st.CoordinatorAddr, "RUNNER="+st.RunnerAddr, "TOKEN="+token)
	// check: valid.json names wallet run_5f0c2a9e41b7d3c8, no wallet of job tkt_18422 in the
	// runner's store, and a package pays only from its own job's wallet.
	want := map[string][]string{
		"list":        {"handoff.v1.CoordinatorService", "grpc.health.v1.Health"},
		"check":       {`"status": "ACK_STATUS_REJECTED_BUDGET"`, `"jobId": "tkt_18422"`, `"field": "budget.wallet_id"`},
		"submit":      {`"runId": "run_`, `"jobId": "tkt_42"`},
		"watch":       {"EVENT_KIND_SUBMITTED", "EVENT_KIND_ESCALATED", "ESCALATION_CAUSE_STAGE_FAILED"},
		"escalations": {`"jobId": "tkt_42"`, `"route": "support-leads"`, `"cause": "ESCALATION_CAUSE_STAGE_FAILED"`},
	}
	recipes := readmeRecipes(t, root)
	if len(recipes) != len(want) {
		t.Fatalf("README has %d recipes, the test knows %d: keep them in step", len(recipes), len(want))
	}
	for _, r := range recipes {
		cmd := exec.Command("bash", "-c", r.cmd)
		cmd.Dir, cmd.Env = root, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("recipe %q failed: %v\n%s\n%s", r.name, err, r.cmd, out)
		}
		for _, w := range want[r.name] {
			if !strings.Contains(string(out), w) {
				t.Errorf("recipe %q: output lacks %s\n%s", r.name, w, out)
			}
		}
		if r.name == "submit" {
			var resp struct {
				Job struct {
					RunID string `json:"runId"`
				}
			}
			if err := json.Unmarshal(out, &resp); err != nil || resp.Job.RunID == "" {
				t.Fatalf("submit output has no run id: %v\n%s", err, out)
			}
			env = append(env, "RUN_ID="+resp.Job.RunID)
		}
	}
	// The reading recipes need the header: without the token they are refused.
	for _, r := range recipes {
		if r.name != "escalations" {
			continue
		}
		cmd := exec.Command("bash", "-c", r.cmd)
		cmd.Dir, cmd.Env = root, append(slices.Clone(env), "TOKEN=")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Unauthenticated") {
			t.Errorf("recipe %q without a token: %v\n%s; want Unauthenticated", r.name, err, out)
		}
	}
}
