package llmagent_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

// note is a scripted stage that is no model: its hop gets the agent attributes only.
type note struct{}

func (note) Card() agentrunner.RoleCard { return agentrunner.RoleCard{Name: "note"} }

func (note) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	a, err := in.Artifacts.Put(ctx, artifact.Ref{JobID: in.Package.GetJobId(), Stage: "note", Round: in.Round, Type: "note", SchemaVersion: "note.v1", MediaType: "text/plain"}, []byte("a note"))
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{a}}, nil
}

// genaiRun runs one job through a model stage holding an MCP tool (retrieve) and a scripted
// stage (note) on the real rail, with the GenAI spans on or off, and returns the spans the
// services ended and the model's requests.
func genaiRun(t *testing.T, on bool, steps []testkit.Step) ([]tracetest.SpanStub, []testkit.LLMRequest) {
	t.Helper()
	tools := &testkit.MCPTools{}
	src := `name: genai
max_hops: 6
escalation: {route: leads}
mcp_servers:
  - {name: desk, url: ` + testkit.ServeMCPHTTP(t, tools) + `}
tools:
  - {name: kb.search, access: read, system: helpcenter, mcp: {server: desk, tool: kb_search}}
stages:
  - {name: retrieve, input: raw_ticket.v1, output: {type: chunks, schema_version: chunks.v1}, tools: [kb.search], criteria: [a], max_tool_rounds: 2}
  - {name: note, input: chunks.v1, output: {type: note, schema_version: note.v1}, criteria: [b]}
`
	p, problems, err := pipeline.Parse("genai.yaml", []byte(src))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("%v %v", err, problems)
	}
	m := connect(t, p)
	llm := testkit.ServeLLM(t, testkit.Steps(steps...))
	a, err := stageAgent(t, p, m, llm, "retrieve", "retrieve", nil)
	if err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx := context.Background()
	st, err := stack.Start(ctx, stack.Config{
		DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines: map[string]*pipeline.Pipeline{p.Name: p}, Agents: []agentrunner.Agent{a, note{}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TracerProvider: tp, GenAISpans: on,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	in, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: "tkt_1", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, []byte(`{"ticket_id":"T-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		JobId: "tkt_1", Pipeline: p.Name, Goal: "find the refund policy", Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000},
		Inputs: []*handoffv1.Artifact{in},
	})
	if err != nil {
		t.Fatal(err)
	}
	var job *handoffv1.Job
	testkit.Eventually(t, 20*time.Second, "the run to stop", func() bool {
		g, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		job = g.GetJob()
		return err == nil && job.GetState() != handoffv1.JobState_JOB_STATE_RUNNING
	})
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s, escalation %v", job.GetState(), job.GetEscalation())
	}
	st.Close() // every span ended
	return exp.GetSpans(), llm.Requests()
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value
	}
	return out
}

func byName(spans []tracetest.SpanStub, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// TestGenAISpans: with the runner's GenAI spans on, each agent hop is an invoke_agent span
// under the hop's handoff.ack span, with the agent attributes of the GenAI conventions; the
// model stage's adds its provider, model and the run's token counts, and its MCP tool call
// is an execute_tool span under it with the call's id. With them off there is no gen_ai
// span or attribute at all, and the handoff.* spans are the same.
func TestGenAISpans(t *testing.T) {
	steps := []testkit.Step{
		{Calls: []testkit.Call{{Name: "kb_search", Args: `{"query":"refund duplicate"}`}}, PromptTokens: 120, CompletionTokens: 30},
		{Content: answer, PromptTokens: 200, CompletionTokens: 40},
	}
	var wantIn, wantOut int64
	for _, s := range steps {
		wantIn, wantOut = wantIn+s.PromptTokens, wantOut+s.CompletionTokens
	}

	spans, reqs := genaiRun(t, true, steps)
	ids := map[[8]byte]tracetest.SpanStub{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = s
	}
	parentName := func(s tracetest.SpanStub) string { return ids[s.Parent.SpanID()].Name }

	retrieve := byName(spans, "invoke_agent retrieve")
	if len(retrieve) != 1 {
		t.Fatalf("%d invoke_agent retrieve spans, want 1; spans %v", len(retrieve), names(spans))
	}
	ra := attrs(retrieve[0])
	for k, want := range map[attribute.Key]attribute.Value{
		"gen_ai.operation.name":      attribute.StringValue("invoke_agent"),
		"gen_ai.agent.name":          attribute.StringValue("retrieve"),
		"gen_ai.agent.id":            attribute.StringValue(agentrunner.AgentID("retrieve")),
		"gen_ai.provider.name":       attribute.StringValue(llmagent.Provider),
		"gen_ai.request.model":       attribute.StringValue(reqs[0].Model),
		"gen_ai.usage.input_tokens":  attribute.Int64Value(wantIn),
		"gen_ai.usage.output_tokens": attribute.Int64Value(wantOut),
	} {
		if got, ok := ra[k]; !ok || got != want {
			t.Errorf("invoke_agent retrieve: %s = %v (set %v), want %v", k, got.String(), ok, want.String())
		}
	}
	if got := parentName(retrieve[0]); got != "handoff.ack retrieve" {
		t.Errorf("invoke_agent retrieve's parent is %q, want the hop's handoff.ack retrieve", got)
	}

	tool := byName(spans, "execute_tool kb.search")
	if len(tool) != 1 {
		t.Fatalf("%d execute_tool kb.search spans, want 1; spans %v", len(tool), names(spans))
	}
	callID, _ := reqs[1].Messages[3]["tool_call_id"].(string)
	ta := attrs(tool[0])
	if ta["gen_ai.operation.name"].AsString() != "execute_tool" || ta["gen_ai.tool.name"].AsString() != "kb.search" ||
		callID == "" || ta["gen_ai.tool.call.id"].AsString() != callID {
		t.Errorf("execute_tool attributes %v, want execute_tool kb.search with call id %q", tool[0].Attributes, callID)
	}
	if tool[0].Parent.SpanID() != retrieve[0].SpanContext.SpanID() {
		t.Errorf("execute_tool's parent is %q, want invoke_agent retrieve", parentName(tool[0]))
	}

	// The scripted stage: the agent attributes, nothing of a model.
	nt := byName(spans, "invoke_agent note")
	if len(nt) != 1 {
		t.Fatalf("%d invoke_agent note spans; spans %v", len(nt), names(spans))
	}
	na := attrs(nt[0])
	if na["gen_ai.agent.name"].AsString() != "note" || na["gen_ai.agent.id"].AsString() != agentrunner.AgentID("note") {
		t.Errorf("invoke_agent note attributes %v", nt[0].Attributes)
	}
	for _, k := range []attribute.Key{"gen_ai.provider.name", "gen_ai.request.model", "gen_ai.usage.input_tokens"} {
		if _, ok := na[k]; ok {
			t.Errorf("invoke_agent note has %s, which only a model stage has", k)
		}
	}

	off, _ := genaiRun(t, false, steps)
	for _, s := range off {
		if strings.HasPrefix(s.Name, "invoke_agent") || strings.HasPrefix(s.Name, "execute_tool") {
			t.Errorf("with the GenAI spans off: span %q", s.Name)
		}
		for _, kv := range s.Attributes {
			if strings.HasPrefix(string(kv.Key), "gen_ai.") {
				t.Errorf("with the GenAI spans off: span %q has %s", s.Name, kv.Key)
			}
		}
	}
	// The platform's own hop spans are there either way.
	handoffOnly := func(ss []tracetest.SpanStub) []string {
		var out []string
		for _, s := range ss {
			if strings.HasPrefix(s.Name, "handoff.submit ") || strings.HasPrefix(s.Name, "handoff.send ") || strings.HasPrefix(s.Name, "handoff.ack ") {
				out = append(out, s.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	if got, want := handoffOnly(off), handoffOnly(spans); len(got) == 0 || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("handoff.* spans off %v, on %v: want the same, and some", got, want)
	}
}

func names(spans []tracetest.SpanStub) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}
