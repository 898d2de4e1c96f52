package support

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// draftAgent writes summary_md.v1: an internal triage summary whose every claim line cites a
// help-center chunk key ("[hc-refund-policy]"). It never promises a refund and never
// addresses the customer.
//
// Its critique loop is deterministic. On a first draft (the package carries no evaluator
// FAIL) it makes one honest mistake: the second claim goes out without its citation, so the
// judge fails it with citation_missing. When the package carries a FAIL it revises for each
// failure code: citation_missing -> every claim cites its source; citation_invalid -> only
// keys present in the chunks artifact are cited; refund_promise and constraint_broken -> lines
// that promise a refund or greet/sign off to the customer are dropped. A code it does not
// know becomes an open question for a human.
type draftAgent struct{ card }

// NewDraft returns the draft agent (card "draft", no tools).
func NewDraft() agentrunner.Agent { return &draftAgent{card{Name: StageDraft}} }

type claim struct {
	text string
	keys []string
}

var sentenceEnd = regexp.MustCompile(`[.!?](\s+|$)`)

// sentences splits an article's text into sentences.
func sentences(text string) []string {
	var out []string
	for text != "" {
		loc := sentenceEnd.FindStringIndex(text)
		if loc == nil {
			out = append(out, strings.TrimSpace(text))
			break
		}
		out = append(out, strings.TrimSpace(text[:loc[0]+1]))
		text = text[loc[1]:]
	}
	return out
}

// nextStep is the recommended action per intake category.
var nextStep = map[string]string{
	"billing_double_charge": "Route to the billing team to check whether the second charge is a pending authorisation or a settled duplicate; any reversal or refund is billing's decision, so the reply must not promise one.",
	"refund_request":        "Route to the billing team, which decides on refunds under the refund policy; the reply must not promise one.",
	"account_access":        "Point the customer to the self-service reset; hand lost two-factor devices to the account-security team.",
	"shipping":              "Check the tracking status; past 5 business days without an update, ask logistics to open a courier trace.",
	"subscription":          "Confirm how to cancel from the billing settings and what happens to the current period.",
	"technical":             "Walk the customer through the documented steps; hand an error that persists to the product team with what the customer did and when.",
}

// Run implements agentrunner.Agent.
func (a *draftAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	var it Intake
	if err := readJSON(ctx, in, TypeIntake, &it); err != nil {
		return nil, err
	}
	var ch Chunks
	if err := readJSON(ctx, in, TypeChunks, &ch); err != nil {
		return nil, err
	}
	if ch.NoHit || len(ch.Chunks) == 0 {
		// Sent here by a retriever's no_hit route: the pipeline wants a note saying so.
		if o := in.Package.GetOrigin(); o.GetMove() == handoffv1.Move_MOVE_ROUTE && o.GetRoute().GetName() == RouteNoHit {
			return a.noMatch(ctx, in, it, ch)
		}
		return nil, fmt.Errorf("retrieve found no help-center article (no_hit): draft has nothing to cite and does not write from memory; escalate to a human")
	}

	ev := in.Package.GetEvaluator()
	revising := ev.GetLastVerdict() == handoffv1.Verdict_VERDICT_FAIL && len(ev.GetFailures()) > 0
	var addressed, unknown []string
	valid := map[string]bool{}
	for _, c := range ch.Chunks {
		valid[c.Key] = true
	}

	// Claims: the first sentence of each chunk, then the second sentence of the best one.
	var claims []claim
	for _, c := range ch.Chunks {
		if s := sentences(c.Text); len(s) > 0 {
			claims = append(claims, claim{s[0], []string{c.Key}})
		}
	}
	if s := sentences(ch.Chunks[0].Text); len(s) > 1 {
		claims = append(claims, claim{s[1], []string{ch.Chunks[0].Key}})
	}
	step := nextStep[it.Category]
	if step == "" {
		step = "Answer from the cited articles; escalate to a human where they do not cover the question."
	}
	stepKeys := []string{ch.Chunks[0].Key}
	for _, c := range ch.Chunks[1:] {
		if strings.Contains(step, "refund") && c.Key == "hc-refund-policy" {
			stepKeys = append(stepKeys, c.Key)
		}
	}
	nextClaim := claim{step, stepKeys}

	if !revising {
		// First draft: the second claim loses its citation (the mistake the judge catches).
		if len(claims) > 1 {
			claims[1].keys = nil
		} else {
			nextClaim.keys = nil
		}
	} else {
		for _, f := range ev.GetFailures() {
			switch f.GetCode() {
			case CodeCitationMissing, CodeCitationInvalid, CodeRefundPromise, CodeConstraintBroken:
				// Every claim is built with its own source key, from the chunks only, and no
				// line is allowed to promise a refund or speak to the customer (below).
				if !slices.Contains(addressed, f.GetCode()) {
					addressed = append(addressed, f.GetCode())
				}
			default:
				unknown = append(unknown, fmt.Sprintf("judge failure %s is not something draft can revise automatically: %s", f.GetCode(), f.GetDetail()))
			}
		}
	}
	// Whatever the round: cite only keys the chunks carry, and drop any line that would
	// promise a refund or greet the customer.
	keep := func(c claim) (claim, bool) {
		var keys []string
		for _, k := range c.keys {
			if valid[k] {
				keys = append(keys, k)
			}
		}
		c.keys = keys
		return c, !refundPromise.MatchString(c.text) && !greeting.MatchString(c.text)
	}

	var b strings.Builder
	noteHead(&b, "Triage summary", it)
	if len(it.Facts) > 0 {
		fmt.Fprintf(&b, "> Ticket facts: %s.\n", strings.Join(it.Facts, "; "))
	}
	b.WriteString("\n## Findings\n\n")
	for _, c := range claims {
		if c, ok := keep(c); ok {
			b.WriteString(line(c))
		}
	}
	b.WriteString("\n## Recommended next step\n\n")
	if c, ok := keep(nextClaim); ok {
		b.WriteString(line(c))
	}
	open := questions(append(append([]string(nil), in.Package.GetOpenQuestions()...), unknown...)...)
	if len(open) > 0 {
		b.WriteString("\n## Open questions\n\n")
		for _, q := range open {
			b.WriteString("- " + q + "\n")
		}
	}

	art, err := put(ctx, in, TypeSummary, SchemaSummary, MediaMarkdown, []byte(b.String()))
	if err != nil {
		return nil, err
	}
	hint := "judge the summary against the rubric"
	if revising {
		hint = fmt.Sprintf("revision for round %d addresses: %s; judge again", in.Round, strings.Join(append(addressed, codesOf(unknown)...), ", "))
	}
	return &handoffv1.StageResult{
		Artifacts:      []*handoffv1.Artifact{art},
		SpentUsdMicros: SpendDraft,
		OpenQuestions:  questions(unknown...),
		NextHint:       clip(hint, 1000),
	}, nil
}

// noteHead writes the title and the header lines every internal note of the drafter starts
// with: who the customer is and what they ask (never a refund promise, even quoted).
func noteHead(b *strings.Builder, title string, it Intake) {
	fmt.Fprintf(b, "# %s: ticket %s\n\n", title, it.TicketID)
	b.WriteString("> Internal triage note for the support team; not for sending to the customer.\n")
	header := fmt.Sprintf("> Customer %s, category %s", orUnknown(it.CustomerID), it.Category)
	if q := strings.TrimSpace(it.Question); q != "" && !refundPromise.MatchString(q) {
		header += fmt.Sprintf(`, asks: "%s"`, q)
	}
	if !strings.HasSuffix(header, `?"`) {
		header += "."
	}
	b.WriteString(header + "\n")
}

// noMatch writes the "no matching article" note: what the ticket asks and that nothing in the
// help center answers it, with no claim and no citation, so nothing is made up.
func (a *draftAgent) noMatch(ctx context.Context, in agentrunner.Input, it Intake, ch Chunks) (*handoffv1.StageResult, error) {
	var b strings.Builder
	noteHead(&b, "No matching article", it)
	fmt.Fprintf(&b, "> No matching help-center article: retrieve searched for %q and found nothing to cite, so this note makes no claims.\n", clip(ch.Query, 200))
	if len(it.Facts) > 0 {
		fmt.Fprintf(&b, "> Ticket facts: %s.\n", strings.Join(it.Facts, "; "))
	}
	open := questions(append(append([]string(nil), in.Package.GetOpenQuestions()...), "no help-center article matches this ticket: a human must answer it")...)
	b.WriteString("\n## Open questions\n\n")
	for _, q := range open {
		b.WriteString("- " + q + "\n")
	}
	art, err := put(ctx, in, TypeSummary, SchemaSummary, MediaMarkdown, []byte(b.String()))
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{
		Artifacts:      []*handoffv1.Artifact{art},
		SpentUsdMicros: SpendDraft,
		NextHint:       "judge the no-match note: it cites nothing and promises nothing",
	}, nil
}

func line(c claim) string {
	s := "- " + c.text
	for _, k := range c.keys {
		s += " [" + k + "]"
	}
	return s + "\n"
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// codesOf names the unknown failures in the hint ("unknown: 2").
func codesOf(unknown []string) []string {
	if len(unknown) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%d unknown code(s) left for a human", len(unknown))}
}
