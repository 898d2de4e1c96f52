package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

// TestLLMPipelineStages: with --llm-pipeline, a model stage's card is its pipeline stage's
// agent and exactly its catalogue tools, served by the pipeline's MCP server; a pipeline
// whose judge holds a write tool is refused before any agent is built.
func TestLLMPipelineStages(t *testing.T) {
	url := testkit.ServeMCPHTTP(t, &testkit.MCPTools{})
	write := func(judgeTools string) string {
		f := filepath.Join(t.TempDir(), "p.yaml")
		src := `name: p
max_hops: 10
max_revisions: 1
escalation: {route: leads}
mcp_servers: [{name: desk, url: "` + url + `"}]
tools:
  - {name: kb.search, access: read, system: helpcenter, mcp: {server: desk, tool: kb_search}}
  - {name: crm.patch, access: write, system: crm, mcp: {server: desk, tool: crm_patch}}
stages:
  - {name: billing-retrieve, agent: retrieve, input: intake.v1, output: {type: chunks, schema_version: chunks.v1}, tools: [kb.search], criteria: [a]}
  - {name: draft, input: chunks.v1, output: {type: summary_md, schema_version: summary_md.v1}, criteria: [b]}
  - {name: judge, kind: judge, revise: draft, input: summary_md.v1, output: {type: verdict, schema_version: verdict.v1}, criteria: [c], tools: [` + judgeTools + `]}
  - {name: writeback, kind: writeback, input: summary_md.v1, writer: {system: crm, target: ledger}, output: {type: crm_receipt, schema_version: crm_receipt.v1}, tools: [crm.patch], criteria: [d]}
`
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	p, err := pipeline.Load(write(""))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tools, err := llmagent.ConnectMCP(ctx, p.MCPServers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tools.Close()
	agents, err := buildAgents("billing-retrieve,judge", llmagent.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, p, tools, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cards := map[string][]string{}
	for _, a := range agents {
		if _, ok := a.(*llmagent.Agent); ok {
			cards[a.Card().Name] = a.Card().Tools
		}
	}
	if len(cards) != 2 || !slices.Equal(cards["retrieve"], []string{"kb.search"}) || len(cards["judge"]) != 0 {
		t.Fatalf("model cards %v; want retrieve [kb.search] and judge []", cards)
	}
	if _, err := buildAgents("nope", llmagent.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, p, tools, nil, time.Second); err == nil || !strings.Contains(err.Error(), `no stage "nope"`) {
		t.Fatalf("unknown stage: %v", err)
	}
	if _, err := pipeline.Load(write("crm.patch")); err == nil || !strings.Contains(err.Error(), "judge-no-write") {
		t.Fatalf("a judge with crm.patch loaded: %v", err)
	}
}
