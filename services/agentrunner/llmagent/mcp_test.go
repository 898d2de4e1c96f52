package llmagent_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

// toolsPipeline is a support pipeline whose catalogue is served by one MCP server: a read
// tool (kb.search) and a write tool (crm.patch), held by retrieve and writeback.
func toolsPipeline(t *testing.T, srv pipeline.MCPServer, judgeTools string) *pipeline.Pipeline {
	t.Helper()
	server := "url: " + srv.URL
	if len(srv.Command) > 0 {
		server = "command: [" + strings.Join(srv.Command, ", ") + "]"
	}
	src := `name: tools
max_hops: 10
max_revisions: 1
escalation: {route: leads}
mcp_servers:
  - {name: desk, ` + server + `}
tools:
  - {name: kb.search, access: read, system: helpcenter, mcp: {server: desk, tool: kb_search}}
  - {name: crm.patch, access: write, system: crm, mcp: {server: desk, tool: crm_patch}}
stages:
  - {name: retrieve, input: intake.v1, output: {type: chunks, schema_version: chunks.v1}, tools: [kb.search], criteria: [a], max_tool_rounds: 2}
  - {name: draft, input: chunks.v1, output: {type: summary_md, schema_version: summary_md.v1}, criteria: [b]}
  - {name: judge, kind: judge, revise: draft, input: summary_md.v1, output: {type: verdict, schema_version: verdict.v1}, criteria: [c], tools: [` + judgeTools + `]}
  - {name: writeback, kind: writeback, input: summary_md.v1, writer: {system: crm, target: ledger}, output: {type: crm_receipt, schema_version: crm_receipt.v1}, tools: [crm.patch], criteria: [d]}
`
	p, problems, err := pipeline.Parse("tools.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if judgeTools == "" && pipeline.HasErrors(problems) {
		t.Fatalf("problems: %v", problems)
	}
	return p
}

func connect(t *testing.T, p *pipeline.Pipeline) *llmagent.MCP {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := llmagent.ConnectMCP(ctx, p.MCPServers, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func stageAgent(t *testing.T, p *pipeline.Pipeline, m *llmagent.MCP, llm *testkit.LLM, stage, builtin string, mod func(*llmagent.Config)) (*llmagent.Agent, error) {
	t.Helper()
	base, err := llmagent.StageRole(builtin)
	if err != nil {
		t.Fatal(err)
	}
	role, err := llmagent.RoleFor(p, stage, base, m)
	if err != nil {
		return nil, err
	}
	cfg := llmagent.Config{BaseURL: llm.URL, Model: "m", PriceMicrosPer1KTokens: 10}
	if mod != nil {
		mod(&cfg)
	}
	return llmagent.New(cfg, role)
}

// TestMCPOverStreamableHTTP: a stage's tools come from a real MCP server (in process, over
// streamable HTTP on loopback): the model is offered exactly the card's kb.search, with the
// server's description and input schema, and its call reaches the server.
func TestMCPOverStreamableHTTP(t *testing.T) {
	tools := &testkit.MCPTools{}
	p := toolsPipeline(t, pipeline.MCPServer{URL: testkit.ServeMCPHTTP(t, tools)}, "")
	m := connect(t, p)
	llm := testkit.ServeLLM(t, testkit.Steps(
		testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{"query":"refund duplicate"}`}, {Name: "crm_patch", Args: `{"ticket_id":"T-1","note":"x"}`}}},
		testkit.Step{Content: answer},
	))
	a, err := stageAgent(t, p, m, llm, "retrieve", "retrieve", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Run(context.Background(), retrieveInput(t, 1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	req := llm.Requests()
	if !slices.Equal(req[0].Tools, []string{"kb_search"}) || !strings.Contains(req[0].ToolSpecs[0]["description"].(string), "help center") {
		t.Fatalf("offered %v %v", req[0].Tools, req[0].ToolSpecs)
	}
	if props, _ := req[0].ToolSpecs[0]["parameters"].(map[string]any)["properties"].(map[string]any); props["query"] == nil {
		t.Errorf("kb_search offered without the server's input schema: %v", req[0].ToolSpecs[0])
	}
	if got, want := attempts(res), []string{"kb.search:ok", "crm_patch:tool_not_granted"}; !slices.Equal(got, want) {
		t.Fatalf("tools_tried %v, want %v", got, want)
	}
	if tools.Writes() != 0 {
		t.Fatalf("%d writes: a retrieve stage wrote", tools.Writes())
	}
	// The tool's answer (from the server) went back to the model.
	if c, _ := req[1].Messages[3]["content"].(string); !strings.Contains(c, "hc-refund-policy") {
		t.Fatalf("tool message %v", req[1].Messages[3])
	}
}

// TestJudgeOfferedNoWriteTool: a judge is offered no tools at all (its card holds none, and
// write tools are never its); a pipeline whose judge holds crm.patch fails lint, and the
// runner refuses to build its agent.
func TestJudgeOfferedNoWriteTool(t *testing.T) {
	tools := &testkit.MCPTools{}
	url := testkit.ServeMCPHTTP(t, tools)
	p := toolsPipeline(t, pipeline.MCPServer{URL: url}, "")
	m := connect(t, p)
	llm := testkit.ServeLLM(t, testkit.Steps(testkit.Step{Content: `{"artifact": "{\"verdict\":\"pass\"}", "verdict": "pass"}`}))
	a, err := stageAgent(t, p, m, llm, "judge", "judge", nil)
	if err != nil {
		t.Fatal(err)
	}
	in := retrieveInput(t, 1_000_000)
	in.Package.Stage = "judge"
	if _, err := a.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if got := llm.Requests()[0].Tools; len(got) != 0 {
		t.Fatalf("judge offered %v", got)
	}

	bad := toolsPipeline(t, pipeline.MCPServer{URL: url}, "crm.patch")
	if !slices.ContainsFunc(pipeline.Lint(bad), func(pr pipeline.Problem) bool { return pr.Rule == "judge-no-write" }) {
		t.Fatalf("lint %v: want judge-no-write", pipeline.Lint(bad))
	}
	if _, err := stageAgent(t, bad, m, llm, "judge", "judge", nil); err == nil || !strings.Contains(err.Error(), "judge holds no write tools") {
		t.Fatalf("judge with crm.patch: %v", err)
	}
	// Only the writer of crm gets crm.patch.
	w, err := stageAgent(t, p, m, llm, "writeback", "draft", nil)
	if err != nil || !slices.Equal(w.Card().Tools, []string{"crm.patch"}) {
		t.Fatalf("writeback: %v %v", w, err)
	}
}

// TestMCPStdioSubprocess: the same server as a stdio subprocess; then one that crashes
// mid-call (the stage fails tool_unavailable, nothing written) and one that hangs (the
// stage fails tool_timeout at the tool timeout).
func TestMCPStdioSubprocess(t *testing.T) {
	bin := testkit.BuildMCPServer(t)
	call := testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{"query":"password"}`}}}
	for _, tc := range []struct {
		name string
		args []string
		code string
	}{
		{"ok", nil, ""},
		{"crash", []string{"--crash-on", "kb_search"}, llmagent.CodeUnavailable},
		{"hang", []string{"--delay", "30s"}, llmagent.CodeTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := toolsPipeline(t, pipeline.MCPServer{Command: append([]string{bin}, tc.args...)}, "")
			m := connect(t, p)
			llm := testkit.ServeLLM(t, testkit.Steps(call, testkit.Step{Content: answer}))
			a, err := stageAgent(t, p, m, llm, "retrieve", "retrieve", func(c *llmagent.Config) { c.ToolTimeout = 300 * time.Millisecond })
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := a.Run(context.Background(), retrieveInput(t, 1_000_000))
			if tc.code == "" {
				if err != nil || !slices.Equal(attempts(res), []string{"kb.search:ok"}) {
					t.Fatalf("res %v err %v", res, err)
				}
				if c, _ := llm.Requests()[1].Messages[3]["content"].(string); !strings.Contains(c, "hc-password-reset") {
					t.Fatalf("tool message %v", llm.Requests()[1].Messages[3])
				}
				return
			}
			re := runErr(t, err)
			if got := attempts(&stageResult{re.ToolsTried}); !slices.Equal(got, []string{"kb.search:" + tc.code}) || !strings.Contains(err.Error(), tc.code) {
				t.Fatalf("err %v, attempts %v; want kb.search:%s", err, got, tc.code)
			}
			if len(llm.Requests()) != 1 {
				t.Fatalf("%d model calls: the stage must stop at the broken tool", len(llm.Requests()))
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %s", d)
			}
		})
	}
}

type stageResult struct{ tt []*handoffv1.ToolAttempt }

func (s *stageResult) GetToolsTried() []*handoffv1.ToolAttempt { return s.tt }
