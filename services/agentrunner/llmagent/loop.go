package llmagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// Provider is this agent's gen_ai.provider.name: it speaks the OpenAI chat completions API
// (to OpenAI or to a server compatible with it).
const Provider = "openai"

// maxAttempts is ToolAttempt's cap in a StageResult (tools_tried max_items).
const maxAttempts = 64

// maxToolOutput caps what one tool call hands back to the model.
const maxToolOutput = 16 << 10

// run is one package's loop: what it spent and the tool calls it made.
type run struct {
	a       *Agent
	in      agentrunner.Input
	stage   string
	spent   int64
	tried   []*handoffv1.ToolAttempt
	burned  map[string]bool // tools the package shows as failed
	routes  map[string]*handoffv1.RouteOption
	calls   int // model calls made
	reserve int64
}

// Run implements agentrunner.Agent.
func (a *Agent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	r := &run{a: a, in: in, stage: in.Package.GetStage(), burned: map[string]bool{}, routes: map[string]*handoffv1.RouteOption{}}
	for _, t := range in.Package.GetToolsTried() {
		if !t.GetOk() {
			r.burned[t.GetName()] = true
		}
	}
	for _, o := range in.Routes {
		r.routes[TransferPrefix+o.GetName()] = o
	}
	user, err := a.userMessage(ctx, in, r.burned)
	if err != nil {
		return nil, err
	}
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(a.systemPrompt(in.Package, in.Routes)),
		openai.UserMessage(user),
	}
	tools := a.tools(in.Routes)
	// The runner's invoke_agent span, when the GenAI spans are on: this agent speaks the
	// OpenAI chat completions API.
	telemetry.GenAIModel(ctx, Provider, a.cfg.Model)
	for round := 0; ; round++ {
		resp, err := r.complete(ctx, msgs, tools)
		if err != nil {
			return nil, err
		}
		msg := resp.Choices[0].Message
		if len(msg.ToolCalls) == 0 {
			return r.final(ctx, resp, nil)
		}
		if round >= a.role.MaxToolRounds {
			return nil, r.fail("%s: the model still called tools after %d rounds", StopMaxToolRounds, a.role.MaxToolRounds)
		}
		msgs = append(msgs, msg.ToParam())
		var route *handoffv1.RouteChoice
		for _, c := range msg.ToolCalls {
			if len(r.tried) == maxAttempts {
				return nil, r.fail("the model made more than %d tool calls", maxAttempts)
			}
			out, err := r.call(ctx, c.ID, c.Function.Name, c.Function.Arguments, &route)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, openai.ToolMessage(out, c.ID))
		}
		if route != nil {
			// The transfer ends the stage. Its answer is the turn's text when the model
			// gave one; otherwise one last call, with no tools, asks for it.
			if strings.TrimSpace(msg.Content) != "" {
				return r.final(ctx, resp, route)
			}
			msgs = append(msgs, openai.UserMessage("The transfer is recorded. Now answer with the JSON object only."))
			resp, err := r.complete(ctx, msgs, nil)
			if err != nil {
				return nil, err
			}
			if len(resp.Choices[0].Message.ToolCalls) > 0 {
				return nil, r.fail("the model called tools after its transfer, when only the answer was asked for")
			}
			return r.final(ctx, resp, route)
		}
	}
}

// complete makes one model call, within the spend cap: it reserves the call's worst case
// (a prompt of one token per byte sent, plus max_tokens of completion) and makes the call
// only when the package's remaining money covers it on top of what the stage spent.
func (r *run) complete(ctx context.Context, msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam) (*openai.ChatCompletion, error) {
	a := r.a
	params := openai.ChatCompletionNewParams{
		Model:     a.cfg.Model,
		Messages:  msgs,
		MaxTokens: openai.Int(a.role.MaxTokens),
	}
	if len(tools) > 0 {
		params.Tools = tools
	} else {
		// JSON mode only on a call with no tools: some servers refuse the two together.
		params.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	}
	if a.cfg.Temperature >= 0 {
		params.Temperature = openai.Float(a.cfg.Temperature)
	}
	body, err := json.Marshal(params)
	if err != nil {
		return nil, r.fail("encoding the request: %v", err)
	}
	r.reserve = a.cost(int64(len(body)), a.role.MaxTokens)
	left := r.in.Package.GetBudget().GetUsdRemainingMicros() - r.spent
	if r.reserve > left {
		return nil, r.fail("%s: the next model call could cost up to %d micro-USD and the package has %d left: not made", StopSpendCap, r.reserve, left)
	}
	r.calls++
	resp, err := a.client.New(ctx, params)
	if err != nil {
		var apiErr *openai.Error
		if errors.As(err, &apiErr) {
			msg := fmt.Sprintf("chat completion failed: %s", apiErr.Error())
			if apiErr.Message != "" {
				msg += ": " + clip(apiErr.Message, 300)
			}
			return nil, r.fail("%s", msg)
		}
		return nil, r.fail("chat completion failed: %v", err)
	}
	telemetry.GenAIUsage(ctx, resp.Usage.PromptTokens, resp.Usage.CompletionTokens)
	cost := a.spend(resp.Usage)
	r.spent += cost
	if cost > r.reserve {
		// A server reporting more tokens than one per byte sent plus max_tokens: the cap's
		// bound no longer holds, so the loop stops rather than trust the next reservation.
		return nil, r.fail("%s: the call's reported usage cost %d micro-USD, over the %d reserved for it", StopSpendCap, cost, r.reserve)
	}
	if len(resp.Choices) == 0 {
		return nil, r.fail("response has no choices")
	}
	ch := resp.Choices[0]
	if rf := strings.TrimSpace(ch.Message.Refusal); rf != "" {
		return nil, r.fail("model refused: %s", clip(rf, 300))
	}
	if ch.FinishReason == "length" {
		return nil, r.fail("model output was cut at the token limit")
	}
	return resp, nil
}

// call runs one tool call of the model and records it; it returns what the model is told.
// A transfer sets *route (the first of a turn; later ones are ignored). Only an error that
// ends the stage is returned as an error.
func (r *run) call(ctx context.Context, callID, name, args string, route **handoffv1.RouteChoice) (string, error) {
	if opt, ok := r.routes[name]; ok {
		if *route != nil {
			r.record(name, CodeTransferIgnored, 0, "the turn already transferred to "+(*route).GetName())
			return "Ignored: this turn already transferred to " + (*route).GetName() + ".", nil
		}
		raw, err := argsObject(args)
		var ta transferArgs
		if err == nil {
			err = json.Unmarshal(raw, &ta)
		}
		if err != nil {
			r.record(name, CodeBadArguments, 0, clip(err.Error(), 200))
			return "", r.fail("%s: %s arguments: %v", CodeBadArguments, name, err)
		}
		prio, ok := priorities[strings.ToLower(strings.TrimSpace(ta.Priority))]
		if !ok {
			r.record(name, CodeBadArguments, 0, "bad priority")
			return "", r.fail("%s: %s priority %q: want low, normal, high or urgent", CodeBadArguments, name, clip(ta.Priority, 40))
		}
		*route = &handoffv1.RouteChoice{Name: opt.GetName(), Reason: clip(strings.TrimSpace(ta.Reason), 500), Priority: prio}
		r.record(name, "", 0, "")
		return "Transferred to " + opt.GetName() + ".", nil // a sentinel for the loop; the model's turn is over
	}
	if *route != nil {
		n := attemptName(name)
		if t, ok := r.a.offer[name]; ok {
			n = t.Name
		}
		r.record(n, CodeAfterTransfer, 0, "the stage ended at its transfer to "+(*route).GetName())
		return "Not run: the stage already transferred to " + (*route).GetName() + ".", nil
	}
	t, ok := r.a.offer[name]
	if !ok {
		r.record(attemptName(name), CodeNotGranted, 0, "not on the stage's card")
		return fmt.Sprintf("Error: tool %q is not granted to this stage; use only the tools offered.", clip(name, 64)), nil
	}
	raw, err := argsObject(args)
	if err != nil {
		r.record(t.Name, CodeBadArguments, 0, clip(err.Error(), 200))
		return "", r.fail("%s: %s %v", CodeBadArguments, t.Name, err)
	}
	cctx, cancel := context.WithTimeout(ctx, r.a.cfg.ToolTimeout)
	end := telemetry.StartTool(cctx, t.Name, callID)
	start := time.Now()
	out, err := t.Call(cctx, raw)
	d := time.Since(start)
	end(err)
	cancel()
	if err != nil {
		code := CodeToolError
		var te *ToolError
		switch {
		case errors.As(err, &te):
			code = te.Code
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			code = CodeTimeout
		case ctx.Err() != nil:
			code = CodeUnavailable
		}
		// The attempt travels in every later package: a tool's error may quote what the
		// system of record holds, so personal data in it is masked.
		r.record(t.Name, code, d, clip(pii.Builtin().Mask(err.Error()), 200))
		if fatal(code) {
			return "", r.fail("tool %s: %v", t.Name, err)
		}
		return "Error: " + clip(err.Error(), 1000), nil
	}
	r.record(t.Name, "", d, "")
	return clip(out, maxToolOutput), nil
}

var priorities = map[string]handoffv1.RoutePriority{
	"":       handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL,
	"low":    handoffv1.RoutePriority_ROUTE_PRIORITY_LOW,
	"normal": handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL,
	"high":   handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH,
	"urgent": handoffv1.RoutePriority_ROUTE_PRIORITY_URGENT,
}

// record adds one attempt, as the runtime saw it; code "" is a success.
func (r *run) record(name, code string, d time.Duration, detail string) {
	r.tried = append(r.tried, &handoffv1.ToolAttempt{
		Name: name, Ok: code == "", ErrorCode: code, Stage: r.stage, Detail: detail,
		DurationMs: d.Milliseconds(), Retry: r.burned[name],
	})
}

// fail is the stage's error, carrying what it spent and the tools it tried.
func (r *run) fail(format string, args ...any) error {
	return &agentrunner.RunError{
		Err:            fmt.Errorf("llm %s: %s", r.a.cfg.Model, fmt.Sprintf(format, args...)),
		SpentUsdMicros: r.spent,
		ToolsTried:     r.tried,
	}
}

// final reads the model's answer into the stage's result.
func (r *run) final(ctx context.Context, resp *openai.ChatCompletion, route *handoffv1.RouteChoice) (*handoffv1.StageResult, error) {
	a := r.a
	content := stripFence(resp.Choices[0].Message.Content)
	var ans answer
	dec := json.NewDecoder(strings.NewReader(content))
	if err := dec.Decode(&ans); err != nil {
		return nil, r.fail("model output is not a JSON object: %v (output starts %q)", err, clip(content, 120))
	}
	if dec.More() {
		return nil, r.fail("model output has data after the JSON object")
	}
	text, err := a.artifactText(ans.Artifact)
	if err != nil {
		return nil, r.fail("%v", err)
	}
	res := &handoffv1.StageResult{
		SpentUsdMicros: r.spent,
		OpenQuestions:  cleanQuestions(ans.OpenQuestions),
		NextHint:       clip(strings.TrimSpace(ans.NextHint), 1000),
		ToolsTried:     r.tried,
		Route:          route,
	}
	if a.role.Judge {
		ev, err := a.evaluator(ans, r.in.Round)
		if err != nil {
			return nil, r.fail("%v", err)
		}
		res.Evaluator = ev
	}
	in := r.in
	art, err := in.Artifacts.Put(ctx, artifact.Ref{
		JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: a.role.Output.Type, SchemaVersion: a.role.Output.SchemaVersion, MediaType: a.role.Output.MediaType,
	}, text)
	if err != nil {
		return nil, r.fail("storing the artifact: %v", err)
	}
	res.Artifacts = []*handoffv1.Artifact{art}
	return res, nil
}

// tools is what the model is offered: the card's tools and one transfer per route.
func (a *Agent) tools(routes []*handoffv1.RouteOption) []openai.ChatCompletionToolUnionParam {
	var out []openai.ChatCompletionToolUnionParam
	for _, t := range a.role.Tools {
		params := t.Params
		if params == nil {
			params = map[string]any{"type": "object", "properties": map[string]any{}}
		}
		out = append(out, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: wireName(t.Name), Description: openai.String(t.Description), Parameters: params,
		}))
	}
	for _, o := range routes {
		desc := strings.TrimSpace(o.GetDescription())
		if desc == "" {
			desc = "Hand the job to route " + o.GetName() + "."
		}
		out = append(out, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: TransferPrefix + o.GetName(), Description: openai.String(desc), Parameters: transferParams,
		}))
	}
	return out
}

// cost prices tokens, rounded up: integer micro-USD, never a float.
func (a *Agent) cost(prompt, completion int64) int64 {
	m := prompt*a.price.PromptMicrosPer1K + completion*a.price.CompletionMicrosPer1K
	if m <= 0 {
		return 0
	}
	return (m + 999) / 1000
}

// spend prices a completion's usage.
func (a *Agent) spend(u openai.CompletionUsage) int64 {
	p, c := u.PromptTokens, u.CompletionTokens
	if p+c <= 0 && u.TotalTokens > 0 {
		p = u.TotalTokens // a server that reports only the total: priced as prompt
	}
	return a.cost(max(p, 0), max(c, 0))
}
