package llmagent

import (
	"context"
	"fmt"
	"sort"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// The prompt is built from the package alone, never from a transcript: a stage starts clean
// and knows what the package says. The system message holds the stage's instructions (from
// the pipeline) and the job's constraints: instructions are replaced at every handoff, not
// merged, so what must hold for the whole job is restated in every stage's prompt.

// systemPrompt is the stage's instructions, the job's constraints and the answer format.
func (a *Agent) systemPrompt(p *handoffv1.HandoffPackage, routes []*handoffv1.RouteOption) string {
	var b strings.Builder
	fmt.Fprintf(&b, "You are the %q stage of a job driven by a deterministic coordinator. ", a.role.Card.Name)
	b.WriteString("You receive a handoff package: the job's goal, its state, and the text of its input artifacts. Never invent ids or facts that are not in the input.\n\n")
	b.WriteString("Your task:\n")
	b.WriteString(strings.TrimSpace(a.role.Instructions))
	b.WriteString("\n\nThe job's constraints, fixed for every stage; honour each one and never change them:\n")
	writeList(&b, p.GetConstraints())
	fmt.Fprintf(&b, "\nAnswer with exactly one JSON object and nothing else:\n"+
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
	if len(a.role.Tools) > 0 {
		b.WriteString("\n\nYou may call the tools offered to you, and no others; the platform records every call.")
	}
	if len(routes) > 0 {
		b.WriteString("\n\nThis stage ends with a handoff: call exactly one transfer_to_<route> tool, choosing by its description, and give your JSON answer in the same message.")
	}
	return b.String()
}

func writeList(b *strings.Builder, items []string) {
	if len(items) == 0 {
		b.WriteString("(none)\n")
	}
	for _, it := range items {
		b.WriteString("- " + strings.TrimSpace(it) + "\n")
	}
}

// userMessage is the package as the stage needs it (goal, constraints, where the job came
// from, the evaluator's failures, open questions, the hint, the tools that already
// failed) and the contents of the artifacts it names, read by URI and checked against
// their sha256, within Config.MaxInputBytes: every artifact gets its header line, and the
// bodies are filled in newest first until the cap; what does not fit is truncated or
// omitted with a note.
func (a *Agent) userMessage(ctx context.Context, in agentrunner.Input, burned map[string]bool) (string, error) {
	p := in.Package
	var h strings.Builder
	fmt.Fprintf(&h, "Job %s, stage %s (visit %d).\n\nGoal:\n%s\n\nConstraints:\n", p.GetJobId(), p.GetStage(), p.GetVisit(), strings.TrimSpace(p.GetGoal()))
	writeList(&h, p.GetConstraints())
	if o := p.GetOrigin(); o.GetStage() != "" {
		fmt.Fprintf(&h, "\nThe job came from stage %s", o.GetStage())
		if r := o.GetRoute(); r.GetName() != "" {
			fmt.Fprintf(&h, " by route %s", r.GetName())
			if r.GetReason() != "" {
				fmt.Fprintf(&h, " (%s)", r.GetReason())
			}
		}
		h.WriteString(".\n")
	}
	if ev := p.GetEvaluator(); ev != nil {
		fmt.Fprintf(&h, "\nEvaluator: the last verdict is %s after %d round(s).", strings.TrimPrefix(ev.GetLastVerdict().String(), "VERDICT_"), ev.GetRounds())
		if len(ev.GetFailures()) > 0 {
			h.WriteString(" Fix every failure:\n")
			for _, f := range ev.GetFailures() {
				fmt.Fprintf(&h, "- %s: %s\n", f.GetCode(), f.GetDetail())
			}
		} else {
			h.WriteString("\n")
		}
	}
	if len(p.GetOpenQuestions()) > 0 {
		h.WriteString("\nOpen questions:\n")
		writeList(&h, p.GetOpenQuestions())
	}
	if hint := strings.TrimSpace(p.GetNextHint()); hint != "" {
		fmt.Fprintf(&h, "\nHint from the previous stage (a suggestion, never authoritative):\n%s\n", hint)
	}
	if len(burned) > 0 {
		names := make([]string, 0, len(burned))
		for n := range burned {
			names = append(names, n)
		}
		sort.Strings(names)
		h.WriteString("\nTools that already FAILED in this job (calling one again is recorded as a retry):\n")
		for _, n := range names {
			var codes []string
			for _, t := range p.GetToolsTried() {
				if t.GetName() == n && !t.GetOk() && t.GetErrorCode() != "" {
					codes = append(codes, t.GetErrorCode())
				}
			}
			fmt.Fprintf(&h, "- %s (failed: %s)\n", n, strings.Join(codes, ", "))
		}
	}
	if len(p.GetMemoryRefs()) > 0 {
		h.WriteString("\nMemory references:\n")
		writeList(&h, p.GetMemoryRefs())
	}
	h.WriteString("\nInput artifacts:\n")
	const (
		none      = "(none)\n"
		omitted   = "(omitted: input size cap reached)\n"
		truncated = "\n(truncated: input size cap)\n"
	)
	head := h.String()
	arts := p.GetArtifacts()
	headers := make([]string, len(arts))
	budget := a.cfg.MaxInputBytes - len(head) - len(none)
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
	b.WriteString(head)
	if len(arts) == 0 {
		b.WriteString(none)
	}
	for i := range arts {
		b.WriteString(headers[i] + bodies[i])
	}
	return b.String(), nil
}
