// Package llmagent is a stage agent backed by any OpenAI-compatible chat-completions server
// (OpenAI, vLLM, llama.cpp, Ollama, LM Studio, ...).
//
// Per package it runs a tool-calling loop (loop.go). The model is offered exactly the tools
// on the stage's card (Role.Tools, served by MCP servers: mcp.go) and, for a stage with
// declared routes, one transfer_to_<route> tool per route. The loop ends at the first of:
//
//   - a final answer: an assistant message with no tool calls, holding a JSON object
//     {"artifact": "...", "open_questions": ["..."], "next_hint": "...",
//     "verdict": "pass|fail", "failures": [{"code": "...", "detail": "..."}]};
//   - a transfer: the stage ends on that route (the rail then checks it);
//   - Role.MaxToolRounds rounds of tool calls (the stage FAILS);
//   - the spend cap: the next call could cost more than the package has left (FAILS
//     before making it).
//
// The runtime, not the model, records every tool call in tools_tried (name, ok or error
// code, duration, stage, retry). verdict and failures are read only for a judge role. The
// artifact text is stored with artifact.Store.Put as the role's output type; spend is
// priced from the usage tokens. Anything malformed is an error with the reason, which the
// runner turns into a STAGE_STATUS_FAILED result.
package llmagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/santhosh-tekuri/jsonschema/v6"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// Config says which server and model to use and what tokens cost.
type Config struct {
	// BaseURL of the OpenAI-compatible API, including its version path
	// ("https://api.openai.com/v1", "http://127.0.0.1:11434/v1"). Required.
	BaseURL string
	// Model name as the server knows it. Required.
	Model string
	// APIKey is sent as "Authorization: Bearer <key>"; empty for servers that need none.
	APIKey string
	// Temperature is sent as is (0 = as deterministic as the model gets); a negative value
	// leaves it out, for models that accept only their default.
	Temperature float64
	// PriceMicrosPer1KTokens is what 1000 tokens (prompt or completion) cost in micro-USD
	// when Prices has no entry for Model.
	PriceMicrosPer1KTokens int64
	// Prices is the per-model price table, integer micro-USD per 1000 tokens.
	Prices map[string]Price
	// Timeout bounds one completion request (default 60s); the runner's stage timeout
	// still applies from outside.
	Timeout time.Duration

	// MaxInputBytes caps the user message (package + artifact text), default 48 KiB.
	MaxInputBytes int
	// MaxRetries is how often a request answered 429, 408, 409 or 5xx (or not answered) is
	// retried, with exponential backoff that honours Retry-After (default 0: none).
	MaxRetries int
	// ToolTimeout bounds one tool call (default 20s).
	ToolTimeout time.Duration
	// HTTPClient replaces the default HTTP client.
	HTTPClient *http.Client
}

// Output describes the artifact a role produces.
type Output struct {
	Type, SchemaVersion, MediaType string
}

// Role is what one LLM-backed stage is: its card, what it must produce, and for a judge
// which failure codes it may use.
type Role struct {
	Card agentrunner.RoleCard
	// Instructions say what the stage must produce (the heart of the system prompt).
	Instructions string
	Output       Output
	// Judge makes the agent read verdict and failures and return an Evaluator.
	Judge bool
	// FailureCodes a judge may use; empty allows any code of the form [a-z][a-z0-9_]*.
	FailureCodes []string
	// Tools are the tools the stage is granted, each with its implementation; the card
	// lists exactly these (New fills Card.Tools when it is empty, and refuses a card that
	// lists a tool with no implementation). The model is offered these and nothing else.
	Tools []Tool
	// Writer says the stage is the writer of its system: only then may it hold write tools.
	Writer bool
	// MaxToolRounds bounds the rounds of tool calls (default 4); a model that still calls
	// tools after that many fails the stage.
	MaxToolRounds int
	// MaxTokens is each completion's max_tokens (default 2048): what the spend cap reserves.
	MaxTokens int64
	// OutputSchema, when set, is the JSON Schema a JSON output must satisfy before it
	// leaves the runner (the pipeline's output.json_schema; see LoadSchema).
	OutputSchema *jsonschema.Schema
}

// Price is what 1000 tokens of a model cost, in micro-USD.
type Price struct {
	PromptMicrosPer1K, CompletionMicrosPer1K int64
}

// JudgeCodes are the failure codes of the support judge's rubric.
var JudgeCodes = []string{"citation_missing", "citation_invalid", "refund_promise", "constraint_broken"}

// StageRole returns the built-in role for a support-pipeline stage (intake, retrieve, draft,
// judge), matching the artifacts the deterministic support agents produce.
func StageRole(stage string) (Role, error) {
	switch stage {
	case "intake":
		return Role{
			Card:   agentrunner.RoleCard{Name: "intake"},
			Output: Output{"intake", "intake.v1", "application/json"},
			Instructions: `Read the raw_ticket artifact and produce the intake.v1 artifact: a JSON object
{"ticket_id", "customer_id", "category", "question", "facts": [strings]}. Copy ids exactly as the ticket
gives them; never invent one. category is one of billing_double_charge, refund_request,
account_access, shipping, subscription, general. question is the customer's question in one sentence.
facts are short statements the ticket itself makes (amounts, dates, references). Put everything the
ticket leaves unknown that a later stage would need (for example the customer's timezone) in open_questions.`,
		}, nil
	case "retrieve":
		return Role{
			Card:   agentrunner.RoleCard{Name: "retrieve"},
			Output: Output{"chunks", "chunks.v1", "application/json"},
			Instructions: `Read the intake artifact and produce the chunks.v1 artifact: a JSON object
{"chunks": [{"key", "title", "text"}], "no_hit": bool}, using only help-center passages given to you in
the input artifacts. Keep each key exactly as given. If nothing given answers the question, return
{"chunks": [], "no_hit": true}; never write a passage from memory.`,
		}, nil
	case "draft":
		return Role{
			Card:   agentrunner.RoleCard{Name: "draft"},
			Output: Output{"summary_md", "summary_md.v1", "text/markdown"},
			Instructions: `Read the intake and chunks artifacts and write the summary_md.v1 artifact: an internal
triage summary in Markdown for the support team, not addressed to the customer (no greeting, no sign-off).
Every claim line must end with at least one citation of a chunk key in square brackets, for example
[hc-refund-policy], and cite only keys present in the chunks artifact. Never promise a refund. If the
package carries an evaluator with last_verdict FAIL, revise the previous summary to fix every listed
failure and say in next_hint which failure codes you addressed.`,
		}, nil
	case "judge":
		return Role{
			Card:         agentrunner.RoleCard{Name: "judge"},
			Output:       Output{"verdict", "verdict.v1", "application/json"},
			Judge:        true,
			FailureCodes: JudgeCodes,
			Instructions: `Judge the newest summary_md artifact against this rubric and nothing else:
citation_missing: a claim line (not a heading, blockquote or open question) has no [key] citation;
citation_invalid: a cited key is not a key of the chunks artifact;
refund_promise: the summary promises a refund ("we will refund", "you will get a refund", ...);
constraint_broken: the summary breaks one of the package's constraints.
Set verdict "pass" with no failures, or "fail" with one failure per broken criterion, each with a detail
quoting the offending line. The artifact is a verdict.v1 JSON object {"verdict", "failures"}. You write
nothing anywhere else.`,
		}, nil
	}
	return Role{}, fmt.Errorf("llmagent: no built-in role for stage %q", stage)
}

// Agent is an LLM-backed stage agent.
type Agent struct {
	role   Role
	cfg    Config
	price  Price
	offer  map[string]*Tool // by the name the model sees
	client openai.ChatCompletionService
}

// New returns an Agent for role served by cfg's endpoint.
func New(cfg Config, role Role) (*Agent, error) {
	switch {
	case cfg.BaseURL == "":
		return nil, errors.New("llmagent: Config.BaseURL is required")
	case cfg.Model == "":
		return nil, errors.New("llmagent: Config.Model is required")
	case role.Card.Name == "":
		return nil, errors.New("llmagent: role card has no name")
	case role.Output.Type == "" || role.Output.SchemaVersion == "":
		return nil, errors.New("llmagent: role has no output type and schema version")
	case cfg.PriceMicrosPer1KTokens < 0:
		return nil, errors.New("llmagent: negative price")
	}
	for m, p := range cfg.Prices {
		if p.PromptMicrosPer1K < 0 || p.CompletionMicrosPer1K < 0 {
			return nil, fmt.Errorf("llmagent: negative price for model %q", m)
		}
	}
	if role.Output.MediaType == "" {
		role.Output.MediaType = "text/plain"
	}
	if role.MaxToolRounds < 0 || role.MaxTokens < 0 {
		return nil, errors.New("llmagent: negative max_tool_rounds or max_tokens")
	}
	if role.MaxToolRounds == 0 {
		role.MaxToolRounds = 4
	}
	if role.MaxTokens == 0 {
		role.MaxTokens = 2048
	}
	if cfg.ToolTimeout <= 0 {
		cfg.ToolTimeout = 20 * time.Second
	}
	offer, err := grant(&role)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.MaxInputBytes <= 0 {
		cfg.MaxInputBytes = 48 << 10
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	// Only the options given here: no OPENAI_* environment defaults leak into a runner
	// configured for some other server.
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(max(cfg.MaxRetries, 0)),
		option.WithRequestTimeout(cfg.Timeout),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	price, ok := cfg.Prices[cfg.Model]
	if !ok {
		price = Price{cfg.PriceMicrosPer1KTokens, cfg.PriceMicrosPer1KTokens}
	}
	return &Agent{role: role, cfg: cfg, price: price, offer: offer, client: openai.NewChatCompletionService(opts...)}, nil
}

// Card implements agentrunner.Agent.
func (a *Agent) Card() agentrunner.RoleCard { return a.role.Card }

// answer is the JSON object the model must return.
type answer struct {
	Artifact      json.RawMessage `json:"artifact"`
	OpenQuestions []string        `json:"open_questions"`
	NextHint      string          `json:"next_hint"`
	Verdict       string          `json:"verdict"`
	Failures      []struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	} `json:"failures"`
}

var failureCode = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// artifactText turns the model's "artifact" member into the bytes to store.
func (a *Agent) artifactText(raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New(`model output has no "artifact"`)
	}
	isJSON := a.role.Output.MediaType == "application/json"
	var text string
	switch raw[0] {
	case '"':
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, fmt.Errorf(`"artifact" is not a valid JSON string: %v`, err)
		}
	case '{', '[':
		if !isJSON {
			return nil, fmt.Errorf(`"artifact" must be a string of %s, got a JSON value`, a.role.Output.MediaType)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, fmt.Errorf(`"artifact" is not valid JSON: %v`, err)
		}
		text = buf.String()
	default:
		return nil, fmt.Errorf(`"artifact" must be a string, got %s`, clip(string(raw), 40))
	}
	if strings.TrimSpace(text) == "" {
		return nil, errors.New(`"artifact" is empty`)
	}
	if isJSON {
		if err := a.checkJSON(text); err != nil {
			return nil, err
		}
	}
	if len(text) > artifact.MaxBytes {
		return nil, fmt.Errorf("the artifact is larger than %d bytes", artifact.MaxBytes)
	}
	return []byte(text), nil
}

// evaluator checks a judge's verdict and failures.
func (a *Agent) evaluator(ans answer, round uint32) (*handoffv1.Evaluator, error) {
	ev := &handoffv1.Evaluator{Rounds: round + 1}
	switch strings.ToLower(strings.TrimSpace(ans.Verdict)) {
	case "pass":
		ev.LastVerdict = handoffv1.Verdict_VERDICT_PASS
	case "fail":
		ev.LastVerdict = handoffv1.Verdict_VERDICT_FAIL
	case "":
		return nil, errors.New(`judge output has no "verdict"`)
	default:
		return nil, fmt.Errorf(`bad verdict %q: want "pass" or "fail"`, clip(ans.Verdict, 40))
	}
	if len(ans.Failures) > 32 {
		return nil, fmt.Errorf("%d failures, at most 32 allowed", len(ans.Failures))
	}
	for i, f := range ans.Failures {
		code := strings.TrimSpace(f.Code)
		if len(code) > 64 || !failureCode.MatchString(code) {
			return nil, fmt.Errorf("bad failure code %q at failures[%d]: want [a-z][a-z0-9_]*", clip(code, 64), i)
		}
		if len(a.role.FailureCodes) > 0 && !slices.Contains(a.role.FailureCodes, code) {
			return nil, fmt.Errorf("bad failure code %q at failures[%d]: not one of %s", code, i, strings.Join(a.role.FailureCodes, ", "))
		}
		ev.Failures = append(ev.Failures, &handoffv1.Failure{Code: code, Detail: clip(strings.TrimSpace(f.Detail), 500)})
	}
	if ev.LastVerdict == handoffv1.Verdict_VERDICT_FAIL && len(ev.Failures) == 0 {
		return nil, errors.New("verdict fail without failures")
	}
	if ev.LastVerdict == handoffv1.Verdict_VERDICT_PASS && len(ev.Failures) > 0 {
		return nil, errors.New("verdict pass with failures")
	}
	return ev, nil
}

// stripFence removes one surrounding Markdown code fence, which some servers add even in
// JSON mode.
func stripFence(s string) string {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "```") || !strings.HasSuffix(s, "```") || len(s) < 6 {
		return s
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "```"), "```")
	if i := strings.IndexByte(s, '\n'); i >= 0 && !strings.ContainsAny(s[:i], "{[") {
		s = s[i+1:] // the fence's language tag
	}
	return strings.TrimSpace(s)
}

func cleanQuestions(qs []string) []string {
	var out []string
	for _, q := range qs {
		if q = clip(strings.TrimSpace(q), 500); q != "" && !slices.Contains(out, q) {
			out = append(out, q)
		}
		if len(out) == 32 {
			break
		}
	}
	return out
}

// clip makes s valid UTF-8 of at most n bytes.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
