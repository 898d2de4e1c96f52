// Package llmagent is a stage agent backed by any OpenAI-compatible chat-completions server
// (OpenAI, vLLM, llama.cpp, Ollama, LM Studio, ...).
//
// Per package it sends one chat completion: a system prompt saying what the stage must
// produce and how to answer, and a user message holding the package (protojson) plus the
// text of its input artifacts (size-capped). It asks for a JSON object
// (response_format json_object) of this shape:
//
//	{"artifact": "...", "open_questions": ["..."], "next_hint": "...",
//	 "verdict": "pass|fail", "failures": [{"code": "...", "detail": "..."}]}
//
// verdict and failures are read only for a judge role. The artifact text is stored with
// artifact.Store.Put as the role's output type; spend is computed from the usage tokens.
// Anything malformed (not JSON, no artifact, a bad verdict or failure code, truncated
// output, a refusal, an HTTP error) is an error with the reason, which the runner turns
// into a STAGE_STATUS_FAILED result. Retries are the rail's business: the client does none
// unless Config.MaxRetries says so.
package llmagent

import (
	"bytes"
	"context"
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
	"github.com/openai/openai-go/v3/shared"
	"google.golang.org/protobuf/encoding/protojson"

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
	// PriceMicrosPer1KTokens is what 1000 tokens (prompt + completion) cost in micro-USD;
	// the stage's spend is usage.total_tokens * price / 1000, rounded up.
	PriceMicrosPer1KTokens int64
	// Timeout bounds one completion request (default 60s); the runner's stage timeout
	// still applies from outside.
	Timeout time.Duration

	// MaxInputBytes caps the user message (package + artifact text), default 48 KiB.
	MaxInputBytes int
	// MaxRetries is how often the client retries a failed request (default 0).
	MaxRetries int
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
}

// JudgeCodes are the failure codes of the support judge's rubric.
var JudgeCodes = []string{"citation_missing", "citation_invalid", "refund_promise", "constraint_broken"}

// StageRole returns the built-in role for a support-pipeline stage (intake, retrieve, draft,
// judge), matching the artifacts the deterministic support agents produce.
func StageRole(stage string) (Role, error) {
	switch stage {
	case "intake":
		return Role{
			Card:   agentrunner.RoleCard{Name: "intake", Tools: []string{"tickets.get"}},
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
			Card:   agentrunner.RoleCard{Name: "retrieve", Tools: []string{"kb.search"}},
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
	if role.Output.MediaType == "" {
		role.Output.MediaType = "text/plain"
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
	return &Agent{role: role, cfg: cfg, client: openai.NewChatCompletionService(opts...)}, nil
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

// Run implements agentrunner.Agent.
func (a *Agent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	user, err := a.userMessage(ctx, in)
	if err != nil {
		return nil, err
	}
	params := openai.ChatCompletionNewParams{
		Model: a.cfg.Model,
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(a.systemPrompt()),
			openai.UserMessage(user),
		},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{
			OfJSONObject: &shared.ResponseFormatJSONObjectParam{},
		},
	}
	if a.cfg.Temperature >= 0 {
		params.Temperature = openai.Float(a.cfg.Temperature)
	}
	resp, err := a.client.New(ctx, params)
	if err != nil {
		var apiErr *openai.Error
		if errors.As(err, &apiErr) {
			msg := fmt.Sprintf("llm %s: chat completion failed: %s", a.cfg.Model, apiErr.Error())
			if apiErr.Message != "" {
				msg += ": " + clip(apiErr.Message, 300)
			}
			return nil, errors.New(msg)
		}
		return nil, fmt.Errorf("llm %s: chat completion failed: %w", a.cfg.Model, err)
	}
	spent := a.spend(resp.Usage)
	// After the call the tokens are spent: failures carry the spend (agentrunner.RunError).
	fail := func(format string, args ...any) error {
		return &agentrunner.RunError{
			Err:            fmt.Errorf("llm %s: %s", a.cfg.Model, fmt.Sprintf(format, args...)),
			SpentUsdMicros: spent,
		}
	}
	if len(resp.Choices) == 0 {
		return nil, fail("response has no choices")
	}
	choice := resp.Choices[0]
	if r := strings.TrimSpace(choice.Message.Refusal); r != "" {
		return nil, fail("model refused: %s", clip(r, 300))
	}
	if choice.FinishReason == "length" {
		return nil, fail("model output was cut at the token limit")
	}
	content := stripFence(choice.Message.Content)
	var ans answer
	dec := json.NewDecoder(strings.NewReader(content))
	if err := dec.Decode(&ans); err != nil {
		return nil, fail("model output is not a JSON object: %v (output starts %q)", err, clip(content, 120))
	}
	if dec.More() {
		return nil, fail("model output has data after the JSON object")
	}
	text, err := a.artifactText(ans.Artifact)
	if err != nil {
		return nil, fail("%v", err)
	}
	res := &handoffv1.StageResult{
		SpentUsdMicros: spent,
		OpenQuestions:  cleanQuestions(ans.OpenQuestions),
		NextHint:       clip(strings.TrimSpace(ans.NextHint), 1000),
	}
	if a.role.Judge {
		ev, err := a.evaluator(ans, in.Round)
		if err != nil {
			return nil, fail("%v", err)
		}
		res.Evaluator = ev
	}
	art, err := in.Artifacts.Put(ctx, artifact.Ref{
		JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: a.role.Output.Type, SchemaVersion: a.role.Output.SchemaVersion, MediaType: a.role.Output.MediaType,
	}, text)
	if err != nil {
		return nil, fail("storing the artifact: %v", err)
	}
	res.Artifacts = []*handoffv1.Artifact{art}
	return res, nil
}

func (a *Agent) systemPrompt() string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are the %q stage of a job driven by a deterministic coordinator. ", a.role.Card.Name)
	b.WriteString("You receive a handoff package (JSON) and the text of its input artifacts. The goal and the constraints in the package are fixed: honour every constraint and never change them. Never invent ids or facts that are not in the input.\n\n")
	b.WriteString("Your task:\n")
	b.WriteString(strings.TrimSpace(a.role.Instructions))
	fmt.Fprintf(&b, "\n\nAnswer with exactly one JSON object and nothing else:\n"+
		`{"artifact": <the complete %s artifact (%s, %s) as a string>, "open_questions": [<things still unknown>], "next_hint": <one sentence for the next stage>`,
		a.role.Output.Type, a.role.Output.SchemaVersion, a.role.Output.MediaType)
	if a.role.Judge {
		b.WriteString(`, "verdict": "pass" or "fail", "failures": [{"code": <criterion code>, "detail": <evidence>}]`)
		if len(a.role.FailureCodes) > 0 {
			fmt.Fprintf(&b, "}\nAllowed failure codes: %s. A pass has no failures; a fail has at least one.", strings.Join(a.role.FailureCodes, ", "))
		} else {
			b.WriteString("}\nA pass has no failures; a fail has at least one.")
		}
	} else {
		b.WriteString("}")
	}
	return b.String()
}

// userMessage is the package JSON plus the text of the input artifacts, within
// Config.MaxInputBytes: every artifact gets its header line, and the bodies are filled in
// newest first until the cap; what does not fit is truncated or omitted with a note. Each
// artifact's bytes are checked against its sha256.
func (a *Agent) userMessage(ctx context.Context, in agentrunner.Input) (string, error) {
	pj, err := protojson.MarshalOptions{UseProtoNames: true, Multiline: true}.Marshal(in.Package)
	if err != nil {
		return "", fmt.Errorf("llm: encoding the package: %w", err)
	}
	const (
		pre       = "Handoff package:\n```json\n"
		mid       = "\n```\n\nInput artifacts:\n"
		none      = "(none)\n"
		omitted   = "(omitted: input size cap reached)\n"
		truncated = "\n(truncated: input size cap)\n"
	)
	arts := in.Package.GetArtifacts()
	headers := make([]string, len(arts))
	budget := a.cfg.MaxInputBytes - len(pre) - len(pj) - len(mid) - len(none)
	for i, art := range arts {
		headers[i] = fmt.Sprintf("\n### %s (%s, %s, from %s)\n", art.GetType(), art.GetSchemaVersion(), art.GetMediaType(), art.GetProducedBy())
		budget -= len(headers[i]) + max(len(omitted), len(truncated))
	}
	if budget < 0 {
		return "", fmt.Errorf("llm: the package and its %d artifact headers are over the %d byte input cap", len(arts), a.cfg.MaxInputBytes)
	}
	bodies := make([]string, len(arts))
	for i := len(arts) - 1; i >= 0; i-- {
		if budget <= 0 {
			bodies[i] = omitted
			continue
		}
		art := arts[i]
		data, err := in.Artifacts.Get(ctx, art.GetUri())
		if err != nil {
			return "", fmt.Errorf("llm: reading %s artifact: %w", art.GetType(), err)
		}
		if err := artifact.Verify(art, data); err != nil {
			return "", fmt.Errorf("llm: %w", err)
		}
		body := strings.ToValidUTF8(string(data), "\uFFFD")
		if len(body)+1 > budget {
			body = clip(body, budget) + truncated
		} else {
			body += "\n"
		}
		budget -= len(body) - len(truncated) // the note's share was reserved above
		bodies[i] = body
	}
	var b strings.Builder
	b.WriteString(pre)
	b.Write(pj)
	b.WriteString(mid)
	if len(arts) == 0 {
		b.WriteString(none)
	}
	for i := range arts {
		b.WriteString(headers[i] + bodies[i])
	}
	return b.String(), nil
}

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
	if isJSON && !json.Valid([]byte(text)) {
		return nil, fmt.Errorf("the %s artifact is not valid JSON", a.role.Output.SchemaVersion)
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

// spend is total tokens times the price per 1000, rounded up.
func (a *Agent) spend(u openai.CompletionUsage) int64 {
	tokens := u.TotalTokens
	if tokens <= 0 {
		tokens = u.PromptTokens + u.CompletionTokens
	}
	if tokens <= 0 || a.cfg.PriceMicrosPer1KTokens <= 0 {
		return 0
	}
	return (tokens*a.cfg.PriceMicrosPer1KTokens + 999) / 1000
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
