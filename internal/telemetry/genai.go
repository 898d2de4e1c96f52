package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/handoffhq/handoff/internal/pii"
)

// GenAI spans: the agent and tool spans of the OpenTelemetry semantic conventions for
// generative AI (semconv v1.41.0, whose gen_ai.* conventions are of Development stability,
// so they are off unless a runner turns them on: --otel-genai). They sit beside the
// platform's own handoff.* spans, which stay as they are:
//
//	invoke_agent {gen_ai.agent.name}   one per agent run (INTERNAL), child of handoff.ack {stage}
//	execute_tool {gen_ai.tool.name}    one per tool call of an LLM stage, child of invoke_agent
//
// The attribute keys come from the semconv package; nothing here spells a gen_ai key.

// GenAIScope is the instrumentation scope of the gen_ai spans.
const GenAIScope = "github.com/handoffhq/handoff/internal/telemetry/genai"

type genaiKey struct{}

// AgentSpan is an agent run's invoke_agent span. A nil *AgentSpan (the conventions are off)
// does nothing.
type AgentSpan struct {
	span     oteltrace.Span
	tracer   oteltrace.Tracer
	in, out  int64
	hasUsage bool
}

// StartAgent starts the invoke_agent span of agent name (id: gen_ai.agent.id) under ctx's
// span, with the tracer provider of that span (the runner's), and returns ctx carrying it:
// GenAIModel, GenAIUsage and StartTool called with that ctx attach to it.
func StartAgent(ctx context.Context, name, id string) (context.Context, *AgentSpan) {
	tr := oteltrace.SpanFromContext(ctx).TracerProvider().Tracer(GenAIScope)
	ctx, span := tr.Start(ctx, semconv.GenAIOperationNameInvokeAgent.Value.AsString()+" "+name,
		oteltrace.WithSpanKind(oteltrace.SpanKindInternal),
		oteltrace.WithAttributes(semconv.GenAIOperationNameInvokeAgent, semconv.GenAIAgentName(name), semconv.GenAIAgentID(id)))
	a := &AgentSpan{span: span, tracer: tr}
	return context.WithValue(ctx, genaiKey{}, a), a
}

// End ends the span, with the token counts reported during the run and an error status
// when err is not nil (the message is the caller's: it must not carry personal data).
func (a *AgentSpan) End(err error) {
	if a == nil {
		return
	}
	if a.hasUsage {
		a.span.SetAttributes(semconv.GenAIUsageInputTokens(int(a.in)), semconv.GenAIUsageOutputTokens(int(a.out)))
	}
	if err != nil {
		a.span.SetStatus(codes.Error, err.Error())
	}
	a.span.End()
}

func agentSpan(ctx context.Context) *AgentSpan {
	a, _ := ctx.Value(genaiKey{}).(*AgentSpan)
	return a
}

// GenAIModel records, on ctx's invoke_agent span, the provider (gen_ai.provider.name, e.g.
// "openai") and model (gen_ai.request.model) an LLM stage calls. Without one, nothing.
func GenAIModel(ctx context.Context, provider, model string) {
	if a := agentSpan(ctx); a != nil {
		a.span.SetAttributes(semconv.GenAIProviderNameKey.String(provider), semconv.GenAIRequestModel(model))
	}
}

// GenAIUsage adds one model call's token counts to ctx's invoke_agent span: the span ends
// with the run's totals (gen_ai.usage.input_tokens, gen_ai.usage.output_tokens).
func GenAIUsage(ctx context.Context, input, output int64) {
	if a := agentSpan(ctx); a != nil {
		a.in, a.out, a.hasUsage = a.in+input, a.out+output, true
	}
}

// StartTool starts the execute_tool span of one tool call (gen_ai.tool.name; callID, when
// known, as gen_ai.tool.call.id) under ctx's invoke_agent span and returns its end, which
// takes the call's error. Without an invoke_agent span in ctx, nothing is started.
func StartTool(ctx context.Context, name, callID string) (end func(err error)) {
	a := agentSpan(ctx)
	if a == nil {
		return func(error) {}
	}
	attrs := []attribute.KeyValue{semconv.GenAIOperationNameExecuteTool, semconv.GenAIToolName(name)}
	if callID != "" {
		attrs = append(attrs, semconv.GenAIToolCallID(callID))
	}
	_, span := a.tracer.Start(ctx, semconv.GenAIOperationNameExecuteTool.Value.AsString()+" "+name,
		oteltrace.WithSpanKind(oteltrace.SpanKindInternal), oteltrace.WithAttributes(attrs...))
	return func(err error) {
		if err != nil {
			// A tool's error may quote what the system of record holds: the trace backend
			// gets it with personal data masked, as the agent span's error is.
			span.SetStatus(codes.Error, pii.Builtin().Mask(err.Error()))
		}
		span.End()
	}
}
