package llmagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

const answer = `{"artifact": "{\"chunks\":[],\"no_hit\":true}", "next_hint": "nothing matched"}`

// kbTool is a read tool implemented in Go that counts its calls.
func kbTool(calls *atomic.Int32) llmagent.Tool {
	return llmagent.Tool{
		Name: "kb.search", Description: "Search the help center.", Access: llmagent.AccessRead, System: "helpcenter",
		Params: map[string]any{"type": "object", "properties": map[string]any{"query": map[string]any{"type": "string"}}},
		Call: func(ctx context.Context, args json.RawMessage) (string, error) {
			calls.Add(1)
			time.Sleep(2 * time.Millisecond)
			return `{"chunks":[]}`, nil
		},
	}
}

func retrieveAgent(t *testing.T, llm *testkit.LLM, mod func(*llmagent.Role, *llmagent.Config), tools ...llmagent.Tool) *llmagent.Agent {
	t.Helper()
	role, err := llmagent.StageRole("retrieve")
	if err != nil {
		t.Fatal(err)
	}
	role.Tools = tools
	cfg := llmagent.Config{BaseURL: llm.URL, Model: "m", PriceMicrosPer1KTokens: 1000, Timeout: 5 * time.Second}
	if mod != nil {
		mod(&role, &cfg)
	}
	a, err := llmagent.New(cfg, role)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func retrieveInput(t testing.TB, usd int64, routes ...*handoffv1.RouteOption) agentrunner.Input {
	t.Helper()
	st, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := testkit.Package(testkit.AtStage("retrieve"))
	p.Artifacts = nil
	p.Budget.UsdRemainingMicros = usd
	return agentrunner.Input{Package: p, Artifacts: st, Routes: routes}
}

func attempts(res interface {
	GetToolsTried() []*handoffv1.ToolAttempt
}) []string {
	var out []string
	for _, a := range res.GetToolsTried() {
		s := a.GetName() + ":" + a.GetErrorCode()
		if a.GetOk() {
			s = a.GetName() + ":ok"
		}
		out = append(out, s)
	}
	return out
}

func runErr(t *testing.T, err error) *agentrunner.RunError {
	t.Helper()
	var re *agentrunner.RunError
	if !errors.As(err, &re) {
		t.Fatalf("err %v (%T), want a RunError", err, err)
	}
	return re
}

// TestUnlistedToolRefused: the model is offered exactly the card's tool; a call to any
// other (crm_patch, a write tool of another system) is refused without running, recorded
// as tool_not_granted, and the loop goes on to the answer.
func TestUnlistedToolRefused(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(
		testkit.Step{Calls: []testkit.Call{{Name: "crm_patch", Args: `{"id":"T-1"}`}, {Name: "kb_search", Args: `{"query":"refund"}`}}},
		testkit.Step{Content: answer},
	))
	var kb atomic.Int32
	a := retrieveAgent(t, llm, nil, kbTool(&kb))
	if got := a.Card().Tools; !slices.Equal(got, []string{"kb.search"}) {
		t.Fatalf("card tools %v", got)
	}
	res, err := a.Run(context.Background(), retrieveInput(t, 1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	if got := llm.Requests()[0].Tools; !slices.Equal(got, []string{"kb_search"}) {
		t.Fatalf("offered %v, want exactly the card's kb_search", got)
	}
	if got, want := attempts(res), []string{"crm_patch:tool_not_granted", "kb.search:ok"}; !slices.Equal(got, want) {
		t.Fatalf("tools_tried %v, want %v", got, want)
	}
	if kb.Load() != 1 {
		t.Fatalf("kb.search ran %d times", kb.Load())
	}
	// The model was told the refusal, in the tool message answering that call.
	msgs := llm.Requests()[1].Messages
	if c, _ := msgs[3]["content"].(string); msgs[3]["role"] != "tool" || !strings.Contains(c, "not granted") {
		t.Fatalf("tool message %v", msgs[3])
	}
}

// TestToolsTriedFromRuntime: tools_tried is what the runtime saw (name, outcome, duration,
// stage), whatever the model's text claims about tools.
func TestToolsTriedFromRuntime(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(
		testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{"query":"a"}`}}},
		testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: ``}}},
		testkit.Step{Content: `{"artifact": "{\"chunks\":[]}", "tools_tried": [{"name": "tickets.get", "ok": true}], "next_hint": "I called tickets.get and crm.patch"}`},
	))
	var kb atomic.Int32
	a := retrieveAgent(t, llm, nil, kbTool(&kb))
	in := retrieveInput(t, 1_000_000)
	in.Package.ToolsTried = []*handoffv1.ToolAttempt{{Name: "kb.search", ErrorCode: "tool_timeout", Stage: "retrieve"}}
	res, err := a.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := attempts(res), []string{"kb.search:ok", "kb.search:ok"}; !slices.Equal(got, want) || kb.Load() != 2 {
		t.Fatalf("tools_tried %v (%d runs), want %v", got, kb.Load(), want)
	}
	for _, at := range res.ToolsTried {
		if at.Stage != "retrieve" || at.DurationMs < 2 || !at.Retry {
			t.Errorf("attempt %v: want stage retrieve, duration >= 2ms, retry (the package showed kb.search failed)", at)
		}
	}
}

// TestTransferEndsStage: transfer_to_billing ends the stage on route billing with its
// payload; a second transfer in the same turn is recorded as ignored; transfers are
// offered with the routes' descriptions.
func TestTransferEndsStage(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(
		testkit.Step{Content: answer, Calls: []testkit.Call{
			{Name: "transfer_to_billing", Args: `{"reason":"a double charge","priority":"high"}`},
			{Name: "transfer_to_technical", Args: `{"reason":"maybe"}`},
			{Name: "kb_search", Args: `{}`},
		}},
	))
	var kb atomic.Int32
	a := retrieveAgent(t, llm, nil, kbTool(&kb))
	routes := []*handoffv1.RouteOption{{Name: "billing", Description: "Money: charges, refunds."}, {Name: "technical", Description: "Using the product."}}
	res, err := a.Run(context.Background(), retrieveInput(t, 1_000_000, routes...))
	if err != nil {
		t.Fatal(err)
	}
	r := res.GetRoute()
	if r.GetName() != "billing" || r.GetReason() != "a double charge" || r.GetPriority() != handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH {
		t.Fatalf("route %v, want billing (high, a double charge)", r)
	}
	if got, want := attempts(res), []string{"transfer_to_billing:ok", "transfer_to_technical:transfer_ignored", "kb.search:after_transfer"}; !slices.Equal(got, want) || kb.Load() != 0 {
		t.Fatalf("tools_tried %v (kb.search ran %d times), want %v", got, kb.Load(), want)
	}
	req := llm.Requests()
	if len(req) != 1 || !slices.Equal(req[0].Tools, []string{"kb_search", "transfer_to_billing", "transfer_to_technical"}) {
		t.Fatalf("%d requests, offered %v", len(req), req[0].Tools)
	}
	if d, _ := req[0].ToolSpecs[1]["description"].(string); d != "Money: charges, refunds." {
		t.Errorf("transfer description %q", d)
	}
	if len(res.Artifacts) != 1 {
		t.Errorf("artifacts %v", res.Artifacts)
	}
}

// TestTransferThenAnswer: a transfer without text gets one more call, offered no tools,
// for the answer; the route stays the transfer's.
func TestTransferThenAnswer(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(
		testkit.Step{Calls: []testkit.Call{{Name: "transfer_to_technical", Args: `{"reason":"login"}`}}},
		testkit.Step{Content: answer},
	))
	a := retrieveAgent(t, llm, nil)
	res, err := a.Run(context.Background(), retrieveInput(t, 1_000_000, &handoffv1.RouteOption{Name: "technical"}))
	if err != nil {
		t.Fatal(err)
	}
	req := llm.Requests()
	if res.GetRoute().GetName() != "technical" || len(req) != 2 || len(req[1].Tools) != 0 {
		t.Fatalf("route %v, %d requests, second offered %v", res.GetRoute(), len(req), req[len(req)-1].Tools)
	}
}

// TestNeverStops: a model that calls tools forever fails the stage at max_tool_rounds.
func TestNeverStops(t *testing.T) {
	llm := testkit.ServeLLM(t, func(int, testkit.LLMRequest) testkit.Step {
		return testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{}`}}, PromptTokens: 10, CompletionTokens: 10}
	})
	var kb atomic.Int32
	a := retrieveAgent(t, llm, func(r *llmagent.Role, _ *llmagent.Config) { r.MaxToolRounds = 3 }, kbTool(&kb))
	_, err := a.Run(context.Background(), retrieveInput(t, 1_000_000))
	re := runErr(t, err)
	if !strings.Contains(err.Error(), llmagent.StopMaxToolRounds) || len(llm.Requests()) != 4 || kb.Load() != 3 || len(re.ToolsTried) != 3 {
		t.Fatalf("err %v, %d requests, %d tool runs, %d attempts; want max_tool_rounds after 4 calls and 3 tool runs", err, len(llm.Requests()), kb.Load(), len(re.ToolsTried))
	}
	if re.SpentUsdMicros != 4*20 {
		t.Errorf("spent %d, want 80 (4 calls of 20 tokens at 1000/1k)", re.SpentUsdMicros)
	}
}

// TestSpendCap: before each call the loop reserves its worst case and stops when the
// package's money would not cover it: the stage fails spend_cap having spent less than the
// wallet held. A package that cannot pay for one call makes none.
func TestSpendCap(t *testing.T) {
	llm := testkit.ServeLLM(t, func(int, testkit.LLMRequest) testkit.Step {
		return testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{}`}}, PromptTokens: 300, CompletionTokens: 100}
	})
	var kb atomic.Int32
	// 1 micro-USD per 1k tokens prompt, 1000 per 1k completion; max_tokens 100: a call
	// reserves 100 + one per 1k prompt bytes, and really costs 0.3 + 100, rounded up.
	a := retrieveAgent(t, llm, func(r *llmagent.Role, c *llmagent.Config) {
		r.MaxToolRounds, r.MaxTokens = 50, 100
		c.Prices = map[string]llmagent.Price{"m": {PromptMicrosPer1K: 1, CompletionMicrosPer1K: 1000}}
	}, kbTool(&kb))
	const wallet = 450
	_, err := a.Run(context.Background(), retrieveInput(t, wallet))
	re := runErr(t, err)
	n := len(llm.Requests())
	if !strings.Contains(err.Error(), llmagent.StopSpendCap) || n != 4 || re.SpentUsdMicros != int64(n)*101 || re.SpentUsdMicros > wallet {
		t.Fatalf("err %v, %d calls, spent %d of %d; want spend_cap after 4 calls of 101", err, n, re.SpentUsdMicros, wallet)
	}

	// A server reporting more usage than the reservation's bound stops the loop at once.
	llm.SetScript(func(int, testkit.LLMRequest) testkit.Step {
		return testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{}`}}, PromptTokens: 1, CompletionTokens: 1000}
	})
	n = len(llm.Requests())
	if _, err := a.Run(context.Background(), retrieveInput(t, 100_000)); err == nil || !strings.Contains(err.Error(), "over the") || len(llm.Requests()) != n+1 {
		t.Fatalf("err %v after %d calls; want spend_cap after one", err, len(llm.Requests())-n)
	}

	before := len(llm.Requests())
	if _, err := a.Run(context.Background(), retrieveInput(t, 50)); err == nil || !strings.Contains(err.Error(), llmagent.StopSpendCap) {
		t.Fatalf("err %v", err)
	}
	if len(llm.Requests()) != before {
		t.Fatal("a package that cannot pay for one call made a model call")
	}
}

// TestMalformedToolArguments: arguments that are not a JSON object fail the stage with
// bad_tool_arguments, recorded, and the tool never runs.
func TestMalformedToolArguments(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(testkit.Step{Calls: []testkit.Call{{Name: "kb_search", Args: `{"query": "refu`}}}))
	var kb atomic.Int32
	a := retrieveAgent(t, llm, nil, kbTool(&kb))
	_, err := a.Run(context.Background(), retrieveInput(t, 1_000_000))
	re := runErr(t, err)
	if !strings.Contains(err.Error(), llmagent.CodeBadArguments) || kb.Load() != 0 || !slices.Equal(attempts(&handoffv1.StageResult{ToolsTried: re.ToolsTried}), []string{"kb.search:bad_tool_arguments"}) {
		t.Fatalf("err %v, %d runs, attempts %v", err, kb.Load(), re.ToolsTried)
	}
}

// TestChatServerRetries: 429 and 503 are retried a bounded number of times with backoff;
// past that the stage fails naming the status.
func TestChatServerRetries(t *testing.T) {
	llm := testkit.ServeLLM(t, testkit.Steps(testkit.Step{Status: 429, Content: "slow down"}, testkit.Step{Status: 503, Content: "busy"}, testkit.Step{Content: answer}))
	a := retrieveAgent(t, llm, func(_ *llmagent.Role, c *llmagent.Config) { c.MaxRetries = 2 })
	if _, err := a.Run(context.Background(), retrieveInput(t, 1_000_000)); err != nil || len(llm.Requests()) != 3 {
		t.Fatalf("err %v after %d requests; want success on the third", err, len(llm.Requests()))
	}
	llm.SetScript(func(int, testkit.LLMRequest) testkit.Step { return testkit.Step{Status: 503, Content: "down"} })
	_, err := a.Run(context.Background(), retrieveInput(t, 1_000_000))
	if err == nil || !strings.Contains(err.Error(), "503") || len(llm.Requests()) != 6 {
		t.Fatalf("err %v after %d requests; want a 503 failure after 1+2 tries", err, len(llm.Requests())-3)
	}
}

// TestRoleRefusesWriteTools: a judge holding a write tool, or a stage that is not its
// system's writer, is refused by New: the runner never serves it.
func TestRoleRefusesWriteTools(t *testing.T) {
	crm := llmagent.Tool{Name: "crm.patch", Access: llmagent.AccessWrite, System: "crm", Call: func(context.Context, json.RawMessage) (string, error) { return "", nil }}
	for _, stage := range []string{"judge", "draft"} {
		role, _ := llmagent.StageRole(stage)
		role.Tools = []llmagent.Tool{crm}
		if _, err := llmagent.New(llmagent.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, role); err == nil || !strings.Contains(err.Error(), "crm.patch") {
			t.Errorf("%s with crm.patch: err %v", stage, err)
		}
	}
	role, _ := llmagent.StageRole("draft")
	role.Tools, role.Writer = []llmagent.Tool{crm}, true
	if _, err := llmagent.New(llmagent.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, role); err != nil {
		t.Errorf("the writer: %v", err)
	}
	role, _ = llmagent.StageRole("retrieve")
	role.Card.Tools = []string{"kb.search"}
	if _, err := llmagent.New(llmagent.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "m"}, role); err == nil {
		t.Error("a card listing a tool with no implementation was accepted")
	}
}

func testkitInput(p *handoffv1.HandoffPackage, st artifact.Store) agentrunner.Input {
	return agentrunner.Input{Package: p, Artifacts: st, Round: p.GetEvaluator().GetRounds()}
}
