package llmagent_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

// fakeLLM answers every request the same way, as its fields say when the request comes,
// from a testkit.LLM.
type fakeLLM struct {
	mu      sync.Mutex
	status  int    // HTTP status to answer with (0 = 200)
	content string // the assistant message content
	finish  string
	usage   [2]int64 // prompt, completion tokens
	llm     *testkit.LLM
}

func (f *fakeLLM) step(int, testkit.LLMRequest) testkit.Step {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := testkit.Step{Status: f.status, Content: f.content, Finish: f.finish, PromptTokens: f.usage[0], CompletionTokens: f.usage[1]}
	if f.status != 0 {
		st.Content = "upstream model crashed"
	}
	return st
}

func (f *fakeLLM) requests() []map[string]any {
	var out []map[string]any
	for _, r := range f.llm.Requests() {
		out = append(out, r.Raw)
	}
	return out
}

func setup(t *testing.T, stage string) (*fakeLLM, *llmagent.Agent, agentrunner.Input) {
	t.Helper()
	f := &fakeLLM{usage: [2]int64{1200, 300}}
	f.llm = testkit.ServeLLM(t, f.step)
	role, err := llmagent.StageRole(stage)
	if err != nil {
		t.Fatal(err)
	}
	a, err := llmagent.New(llmagent.Config{
		BaseURL: f.llm.URL, Model: "tiny-model", APIKey: "sk-test",
		Temperature: 0.2, PriceMicrosPer1KTokens: 1000, Timeout: 5 * time.Second,
	}, role)
	if err != nil {
		t.Fatal(err)
	}
	st, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	intake, err := st.Put(ctx, artifact.Ref{JobID: "job-1", Stage: "intake", Type: "intake", SchemaVersion: "intake.v1", MediaType: "application/json"},
		[]byte(`{"ticket_id":"T-1042","question":"Can I get a refund for the duplicate charge?"}`))
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := st.Put(ctx, artifact.Ref{JobID: "job-1", Stage: "retrieve", Type: "chunks", SchemaVersion: "chunks.v1", MediaType: "application/json"},
		[]byte(`{"chunks":[{"key":"hc-refund-policy","title":"Refund policy","text":"Refunds are decided by billing."}],"no_hit":false}`))
	if err != nil {
		t.Fatal(err)
	}
	in := agentrunner.Input{
		Package: &handoffv1.HandoffPackage{
			Schema: "handoff.v1", JobId: "job-1", Stage: stage, Goal: "Triage ticket T-1042",
			Constraints: []string{"no refund promises"},
			Artifacts:   []*handoffv1.Artifact{intake, chunks},
			Budget:      &handoffv1.Budget{UsdRemainingMicros: 9000, HopsRemaining: 3},
		},
		Artifacts: st,
	}
	return f, a, in
}

func TestDraftRequestAndResult(t *testing.T) {
	f, a, in := setup(t, "draft")
	f.content = `{"artifact": "# Summary\n\n- Refunds are decided by billing. [hc-refund-policy]\n", "open_questions": ["customer timezone", ""], "next_hint": "judge it"}`
	res, err := a.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	// The request.
	if len(f.requests()) != 1 {
		t.Fatalf("%d requests", len(f.requests()))
	}
	req := f.requests()[0]
	if req["model"] != "tiny-model" || req["temperature"] != 0.2 {
		t.Errorf("model/temperature %v %v", req["model"], req["temperature"])
	}
	if rf, _ := req["response_format"].(map[string]any); rf["type"] != "json_object" {
		t.Errorf("response_format %v", req["response_format"])
	}
	if auth := f.llm.Requests()[0].Auth; auth != "Bearer sk-test" {
		t.Errorf("auth header %q", auth)
	}
	msgs, _ := req["messages"].([]any)
	if len(msgs) != 2 {
		t.Fatalf("messages %v", msgs)
	}
	sys, user := msgs[0].(map[string]any), msgs[1].(map[string]any)
	if sys["role"] != "system" || !strings.Contains(sys["content"].(string), "summary_md") || !strings.Contains(sys["content"].(string), "Never promise a refund") {
		t.Errorf("system message %v", sys)
	}
	uc := user["content"].(string)
	for _, want := range []string{"Job job-1, stage draft", "- no refund promises", "Refunds are decided by billing.", "T-1042", "### chunks (chunks.v1"} {
		if user["role"] != "user" || !strings.Contains(uc, want) {
			t.Errorf("user message lacks %q:\n%s", want, uc)
		}
	}
	// The result.
	if res.SpentUsdMicros != 1500 || res.NextHint != "judge it" || len(res.OpenQuestions) != 1 || res.Evaluator != nil {
		t.Fatalf("result %v", res)
	}
	if len(res.Artifacts) != 1 || res.Artifacts[0].Type != "summary_md" || res.Artifacts[0].MediaType != "text/markdown" {
		t.Fatalf("artifacts %v", res.Artifacts)
	}
	data, err := in.Artifacts.Get(context.Background(), res.Artifacts[0].Uri)
	if err != nil || !strings.Contains(string(data), "[hc-refund-policy]") {
		t.Fatalf("stored artifact %q %v", data, err)
	}
}

func TestJudgeVerdict(t *testing.T) {
	f, a, in := setup(t, "judge")
	in.Round = 1
	f.content = "```json\n" + `{"artifact": {"verdict": "fail"}, "verdict": "FAIL", "failures": [{"code": "citation_missing", "detail": "line 3"}], "next_hint": "revise"}` + "\n```"
	res, err := a.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	ev := res.Evaluator
	if ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_FAIL || ev.GetRounds() != 2 || len(ev.Failures) != 1 || ev.Failures[0].Code != "citation_missing" {
		t.Fatalf("evaluator %v", ev)
	}
	data, _ := in.Artifacts.Get(context.Background(), res.Artifacts[0].Uri)
	if string(data) != `{"verdict":"fail"}` || res.Artifacts[0].SchemaVersion != "verdict.v1" {
		t.Fatalf("verdict artifact %q %v", data, res.Artifacts[0])
	}
	f.content = `{"artifact": "{\"verdict\":\"pass\"}", "verdict": "pass", "failures": []}`
	if res, err = a.Run(context.Background(), in); err != nil || res.Evaluator.GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS {
		t.Fatalf("pass: %v %v", res, err)
	}
}

func TestMalformedOutput(t *testing.T) {
	for _, tc := range []struct {
		stage, content, finish, want string
	}{
		{"draft", `Sure! Here is your summary.`, "", "not a JSON object"},
		{"draft", `{"open_questions": []}`, "", `no "artifact"`},
		{"draft", `{"artifact": ""}`, "", "empty"},
		{"draft", `{"artifact": {"x": 1}}`, "", "must be a string"},
		{"draft", `{"artifact": "x"} {"artifact": "y"}`, "", "after the JSON object"},
		{"draft", `{"artifact": "# cut`, "length", "token limit"},
		{"intake", `{"artifact": "not json at all"}`, "", "not valid JSON"},
		{"judge", `{"artifact": "{}", "verdict": "maybe"}`, "", "bad verdict"},
		{"judge", `{"artifact": "{}"}`, "", `no "verdict"`},
		{"judge", `{"artifact": "{}", "verdict": "fail", "failures": [{"code": "Too Vague"}]}`, "", "bad failure code"},
		{"judge", `{"artifact": "{}", "verdict": "fail", "failures": [{"code": "tone"}]}`, "", "not one of"},
		{"judge", `{"artifact": "{}", "verdict": "fail", "failures": []}`, "", "without failures"},
		{"judge", `{"artifact": "{}", "verdict": "pass", "failures": [{"code": "refund_promise"}]}`, "", "pass with failures"},
	} {
		t.Run(tc.stage+"/"+tc.want, func(t *testing.T) {
			f, a, in := setup(t, tc.stage)
			f.content, f.finish = tc.content, tc.finish
			_, err := a.Run(context.Background(), in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			var re *agentrunner.RunError
			if !errors.As(err, &re) || re.SpentUsdMicros != 1500 {
				t.Fatalf("err %T does not carry the spend", err)
			}
		})
	}
}

func TestHTTP500(t *testing.T) {
	f, a, in := setup(t, "draft")
	f.status = http.StatusInternalServerError
	_, err := a.Run(context.Background(), in)
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "upstream model crashed") {
		t.Fatalf("err %v", err)
	}
	if len(f.requests()) != 1 {
		t.Fatalf("%d requests: the client must not retry unless MaxRetries says so", len(f.requests()))
	}
	if strings.Contains(err.Error(), "sk-test") {
		t.Fatal("error leaks the API key")
	}
}

func TestInputCap(t *testing.T) {
	f, _, in := setup(t, "draft")
	role, _ := llmagent.StageRole("draft")
	a, err := llmagent.New(llmagent.Config{BaseURL: f.llm.URL, Model: "m", MaxInputBytes: 4096}, role)
	if err != nil {
		t.Fatal(err)
	}
	big, err := in.Artifacts.Put(context.Background(), artifact.Ref{JobID: "job-1", Stage: "retrieve", Round: 1, Type: "chunks", SchemaVersion: "chunks.v1", MediaType: "application/json"},
		[]byte(strings.Repeat("x", 20000)))
	if err != nil {
		t.Fatal(err)
	}
	in.Package.Artifacts = append(in.Package.Artifacts, big)
	f.content = `{"artifact": "- ok [hc-refund-policy]"}`
	if _, err := a.Run(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	msgs := f.requests()[0]["messages"].([]any)
	uc := msgs[1].(map[string]any)["content"].(string)
	if len(uc) > 4096 || !strings.Contains(uc, "truncated") {
		t.Fatalf("user message is %d bytes (cap 4096), truncated note: %v", len(uc), strings.Contains(uc, "truncated"))
	}
	if _, ok := f.requests()[0]["temperature"]; !ok {
		t.Error("temperature 0 must still be sent")
	}
}

func TestNewErrors(t *testing.T) {
	role, _ := llmagent.StageRole("draft")
	if _, err := llmagent.New(llmagent.Config{Model: "m"}, role); err == nil {
		t.Error("no base URL accepted")
	}
	if _, err := llmagent.New(llmagent.Config{BaseURL: "http://x"}, role); err == nil {
		t.Error("no model accepted")
	}
	if _, err := llmagent.StageRole("writeback"); err == nil {
		t.Error("unknown stage has a role")
	}
	if _, err := llmagent.New(llmagent.Config{BaseURL: "http://x", Model: "m"}, llmagent.Role{Card: agentrunner.RoleCard{Name: "x"}}); err == nil {
		t.Error("role without output accepted")
	}
}
