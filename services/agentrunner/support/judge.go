package support

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// judgeAgent grades the newest summary_md against a fixed rubric and returns the verdict as
// the result's Evaluator (rounds = package rounds + 1) plus a verdict.v1 artifact. A judge
// holds no tools and never writes anywhere but the artifact store.
//
// Rubric (one Failure per broken criterion, its detail naming the offending lines):
//
//   - citation_missing: every claim line cites at least one key ("[hc-refund-policy]"), and
//     a summary makes at least one claim, unless retrieve found nothing (no_hit): a
//     "no matching article" note then makes none.
//     Claim lines are the non-empty lines except headings ("#"), blockquotes (">", the
//     note's header) and the items under an "Open questions" heading (questions, not claims).
//   - citation_invalid: every cited key is a chunk key of the newest chunks artifact.
//   - refund_promise: no phrase that promises a refund ("we will refund", "you will get a
//     refund", "refund you", "guarantee a refund", ...), anywhere in the summary.
//   - constraint_broken: the package's constraints the judge recognises are kept:
//     "do not send to the customer" / "internal only" -> no greeting or sign-off addressed
//     to the customer ("Dear", "Hi ...,", "Kind regards"); "at most N words" -> word count;
//     "no PII" / "no email addresses" -> no e-mail addresses or card numbers. "No refund
//     promises" and "cite sources" are recognised and checked by the rules above.
//
// Constraints it does not recognise are not checked; the verdict artifact lists them under
// ignored_constraints, so a human can see what no one verified.
type judgeAgent struct{ card }

// NewJudge returns the judge agent (card "judge", no tools).
func NewJudge() agentrunner.Agent { return &judgeAgent{card{Name: StageJudge}} }

var (
	refundPromise = regexp.MustCompile(`(?i)\b(we(?:'ll| will| shall| are going to) (?:issue (?:you )?|process )?(?:a |your |the )?(?:full )?refund|you(?:'ll| will) (?:get|receive|be given) (?:a |your |the )?(?:full )?refund|refund you\b|refund(?:ing)? your (?:money|payment|charge)|guarantee(?:d|s)? (?:you )?(?:a |the |your )?(?:full )?refund|(?:a |your )?refund is guaranteed)`)
	greeting      = regexp.MustCompile(`(?i)^\s*(?:[-*]\s*)?(?:dear\b|hi\b|hello\b|hey\b|good (?:morning|afternoon|evening)\b)|\b(?:kind|best|warm) regards\b|\bsincerely\b|\byours truly\b`)
	citation      = regexp.MustCompile(`\[([A-Za-z0-9][A-Za-z0-9_.:-]*)\]`)
	emailAddr     = regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`)
	cardNumber    = regexp.MustCompile(`\b(?:\d[ -]?){13,19}\b`)
	wordLimit     = regexp.MustCompile(`(?i)\b(?:at most|max(?:imum)?|under|no more than|fewer than|up to)\s+(\d+)\s+words\b`)
	notToCustomer = regexp.MustCompile(`(?i)\b(?:do not|don't|never|not to be|must not be) (?:send|sent|email|e-mail|reply|forward)\w*\b.*\bcustomer|\binternal(?:[- ]only| note| use)\b|\bnot customer[- ]facing\b|\bnot for (?:the )?customer`)
	noRefund      = regexp.MustCompile(`(?i)\brefund`)
	promiseWord   = regexp.MustCompile(`(?i)\bpromis|\bguarantee|\bcommit`)
	citeWord      = regexp.MustCompile(`(?i)\bcit(?:e|es|ed|ing|ation|ations)\b|\bsources?\b`)
	noPII         = regexp.MustCompile(`(?i)\bno pii\b|\bpersonal (?:data|information)\b|\bno e-?mail addresses\b|\bcard numbers?\b`)
)

// claimLine is one line the rubric holds to the citation rules.
type claimLine struct {
	n    int // 1-based line number in the summary
	text string
	keys []string
}

// claimLines picks the claim lines of a summary (see the rubric).
func claimLines(md string) []claimLine {
	var out []claimLine
	inQuestions := false
	for i, l := range strings.Split(md, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == "":
			continue
		case strings.HasPrefix(t, "#"):
			inQuestions = strings.Contains(strings.ToLower(t), "open question")
			continue
		case strings.HasPrefix(t, ">"), inQuestions, t == "---":
			continue
		}
		c := claimLine{n: i + 1, text: t}
		for _, m := range citation.FindAllStringSubmatchIndex(t, -1) {
			if m[1] < len(t) && t[m[1]] == '(' {
				continue // a markdown link, not a citation
			}
			c.keys = append(c.keys, t[m[2]:m[3]])
		}
		out = append(out, c)
	}
	return out
}

// Run implements agentrunner.Agent.
func (a *judgeAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	_, data, err := readInput(ctx, in, TypeSummary)
	if err != nil {
		return nil, err
	}
	md := string(data)
	var ch Chunks
	if err := readJSON(ctx, in, TypeChunks, &ch); err != nil && !errors.Is(err, errNoArtifact) {
		return nil, err
	}
	valid := map[string]bool{}
	for _, c := range ch.Chunks {
		valid[c.Key] = true
	}

	v := Verdict{Round: in.Round + 1, Cited: []string{}, CheckedConstraints: []string{}, IgnoredConstraints: []string{}}
	fail := func(code, detail string) {
		v.Failures = append(v.Failures, VerdictFailure{Code: code, Detail: clip(detail, 500)})
	}

	claims := claimLines(md)
	v.Claims = len(claims)
	var missing, invalid []string
	for _, c := range claims {
		if len(c.keys) == 0 {
			missing = append(missing, fmt.Sprintf("line %d %q", c.n, clip(c.text, 80)))
		}
		for _, k := range c.keys {
			if !slices.Contains(v.Cited, k) {
				v.Cited = append(v.Cited, k)
			}
			if !valid[k] {
				invalid = append(invalid, fmt.Sprintf("line %d cites [%s]", c.n, k))
			}
		}
	}
	switch {
	case len(claims) == 0 && ch.NoHit:
		// A no-match note: nothing was found, so nothing may be claimed or cited.
	case len(claims) == 0:
		fail(CodeCitationMissing, "the summary makes no claim to check")
	case len(missing) > 0:
		fail(CodeCitationMissing, fmt.Sprintf("%d of %d claim lines cite no source: %s", len(missing), len(claims), strings.Join(missing, "; ")))
	}
	if len(invalid) > 0 {
		known := make([]string, 0, len(ch.Chunks))
		for _, c := range ch.Chunks {
			known = append(known, c.Key)
		}
		fail(CodeCitationInvalid, fmt.Sprintf("%s; retrieved keys: [%s]", strings.Join(invalid, "; "), strings.Join(known, ", ")))
	}
	if ms := refundPromise.FindAllString(md, 3); len(ms) > 0 {
		fail(CodeRefundPromise, fmt.Sprintf("the summary promises a refund (%q); refunds are billing's decision", strings.Join(ms, `", "`)))
	}

	var broken []string
	for _, c := range in.Package.GetConstraints() {
		checked := true
		switch {
		case noRefund.MatchString(c) && promiseWord.MatchString(c):
			// Same check as refund_promise above.
		case citeWord.MatchString(c):
			// Same checks as citation_missing / citation_invalid above.
		case notToCustomer.MatchString(c):
			var hits []string
			for i, l := range strings.Split(md, "\n") {
				if greeting.MatchString(l) {
					hits = append(hits, fmt.Sprintf("line %d %q", i+1, clip(strings.TrimSpace(l), 60)))
				}
			}
			if len(hits) > 0 {
				broken = append(broken, fmt.Sprintf("%q: customer-addressed text at %s", c, strings.Join(hits, ", ")))
			}
		case wordLimit.MatchString(c):
			limit, _ := strconv.Atoi(wordLimit.FindStringSubmatch(c)[1])
			if n := len(strings.Fields(md)); n > limit {
				broken = append(broken, fmt.Sprintf("%q: the summary has %d words", c, n))
			}
		case noPII.MatchString(c):
			if emailAddr.MatchString(md) || cardNumber.MatchString(md) {
				broken = append(broken, fmt.Sprintf("%q: the summary contains an e-mail address or card number", c))
			}
		default:
			checked = false
		}
		if checked {
			v.CheckedConstraints = append(v.CheckedConstraints, c)
		} else {
			v.IgnoredConstraints = append(v.IgnoredConstraints, c)
		}
	}
	if len(broken) > 0 {
		fail(CodeConstraintBroken, strings.Join(broken, "; "))
	}

	ev := &handoffv1.Evaluator{Rounds: in.Round + 1, LastVerdict: handoffv1.Verdict_VERDICT_PASS}
	v.Verdict = "pass"
	hint := "verdict pass: the summary may go to writeback"
	if len(v.Failures) > 0 {
		ev.LastVerdict = handoffv1.Verdict_VERDICT_FAIL
		v.Verdict = "fail"
		codes := make([]string, len(v.Failures))
		for i, f := range v.Failures {
			ev.Failures = append(ev.Failures, &handoffv1.Failure{Code: f.Code, Detail: f.Detail})
			codes[i] = f.Code
		}
		hint = "verdict fail: revise the draft for " + strings.Join(codes, ", ")
	} else {
		v.Failures = []VerdictFailure{}
	}
	art, err := putJSON(ctx, in, TypeVerdict, SchemaVerdict, v)
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{
		Artifacts:      []*handoffv1.Artifact{art},
		SpentUsdMicros: SpendJudge,
		Evaluator:      ev,
		NextHint:       clip(hint, 1000),
	}, nil
}
