package llmagent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

// TestPromptFromPackage: the prompt is the package's state and its artifacts' contents,
// nothing else: goal, constraints (restated in the system message too: instructions are
// replaced at a handoff), where the job came from, the evaluator's failures, open
// questions, the hint, the tools that already failed; stage instructions come from the
// pipeline.
func TestPromptFromPackage(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(testkit.Step{Content: `{"artifact": "- Billing decides refunds. [hc-refund-policy]"}`}))
	p, problems, err := pipeline.Parse("p.yaml", []byte(`name: p
max_hops: 5
escalation: {route: leads}
stages:
  - name: billing-draft
    agent: draft
    input: chunks.v1
    output: {type: summary_md, schema_version: summary_md.v1}
    criteria: [cites_keys]
    instructions: Write the internal summary from the chunks; cite every claim.
`))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatal(err, problems)
	}
	base, _ := llmagent.StageRole("draft")
	role, err := llmagent.RoleFor(p, "billing-draft", base, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := llmagent.New(llmagent.Config{BaseURL: llm.URL, Model: "m"}, role)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := artifact.NewFiles(t.TempDir())
	chunks, err := st.Put(context.Background(), artifact.Ref{JobID: "tkt_1042", Stage: "billing-retrieve", Type: "chunks", SchemaVersion: "chunks.v1", MediaType: "application/json"},
		[]byte(`{"chunks":[{"key":"hc-refund-policy","title":"Refund policy","text":"Refunds are decided by billing."}],"no_hit":false}`))
	if err != nil {
		t.Fatal(err)
	}
	pkg := testkit.Package(testkit.OfJob("tkt_1042"), testkit.AtStage("billing-draft"), func(p *handoffv1.HandoffPackage) {
		p.Goal = "Summarize ticket T-1042 for the billing desk."
		p.Constraints = []string{"never promise a refund", "cite a help-center key on every claim"}
		p.Visit = 1
		p.Origin = &handoffv1.Origin{Stage: "judge"}
		p.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1,
			Failures: []*handoffv1.Failure{{Code: "citation_missing", Detail: "line 2 has no [key]"}}}
		p.OpenQuestions = []string{"the customer's timezone"}
		p.NextHint = "add the missing citation"
		p.ToolsTried = []*handoffv1.ToolAttempt{{Name: "kb.search", ErrorCode: "tool_timeout", Stage: "billing-retrieve"}}
		p.Artifacts = []*handoffv1.Artifact{chunks}
	})
	if _, err := a.Run(context.Background(), testkitInput(pkg, st)); err != nil {
		t.Fatal(err)
	}
	msgs := llm.Requests()[0].Messages
	sys, user := msgs[0]["content"].(string), msgs[1]["content"].(string)
	for _, want := range []string{"Write the internal summary from the chunks; cite every claim.", "- never promise a refund\n- cite a help-center key on every claim"} {
		if !strings.Contains(sys, want) {
			t.Errorf("system message lacks %q:\n%s", want, sys)
		}
	}
	if strings.Contains(sys, "Never promise a refund. If the") {
		t.Error("the built-in draft instructions were used, not the pipeline's")
	}
	for _, want := range []string{
		"Goal:\nSummarize ticket T-1042 for the billing desk.",
		"Constraints:\n- never promise a refund\n",
		"The job came from stage judge.",
		"Evaluator: the last verdict is FAIL after 1 round(s). Fix every failure:\n- citation_missing: line 2 has no [key]",
		"Open questions:\n- the customer's timezone",
		"Hint from the previous stage (a suggestion, never authoritative):\nadd the missing citation",
		"Tools that already FAILED in this job (calling one again is recorded as a retry):\n- kb.search (failed: tool_timeout)",
		"### chunks (chunks.v1, application/json, from billing-retrieve)\n{\"chunks\":[{\"key\":\"hc-refund-policy\"",
	} {
		if !strings.Contains(user, want) {
			t.Errorf("user message lacks %q", want)
		}
	}
	t.Logf("system:\n%s\n\nuser:\n%s", sys, user)
}

// TestOutputChecked: a JSON output must satisfy the pipeline's JSON Schema and carry the
// declared version before it leaves the runner.
func TestOutputChecked(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "chunks.json"), []byte(`{"type":"object","required":["chunks","no_hit"],"properties":{"chunks":{"type":"array"},"no_hit":{"type":"boolean"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "p.yaml")
	if err := os.WriteFile(src, []byte(`name: p
max_hops: 5
escalation: {route: leads}
stages:
  - {name: retrieve, input: intake.v1, output: {type: chunks, schema_version: chunks.v1, json_schema: chunks.json}, criteria: [a]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := pipeline.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ artifact, want string }{
		{`{\"chunks\": []}`, "does not satisfy its JSON Schema"},
		{`{\"chunks\": [], \"no_hit\": \"no\"}`, "does not satisfy its JSON Schema"},
		{`{\"chunks\": [], \"no_hit\": true, \"schema_version\": \"chunks.v2\"}`, "declares chunks.v1"},
		{`{\"chunks\": [], \"no_hit\": true}`, ""},
	} {
		llm := testkit.ServeLLM(t, testkit.Steps(testkit.Step{Content: `{"artifact": "` + tc.artifact + `"}`}))
		base, _ := llmagent.StageRole("retrieve")
		role, err := llmagent.RoleFor(p, "retrieve", base, nil)
		if err != nil {
			t.Fatal(err)
		}
		a, err := llmagent.New(llmagent.Config{BaseURL: llm.URL, Model: "m"}, role)
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.Run(context.Background(), retrieveInput(t, 1_000_000))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("artifact %s: err %v, want %q", tc.artifact, err, tc.want)
		}
	}
}
