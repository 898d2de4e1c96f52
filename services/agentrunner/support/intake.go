package support

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// intakeAgent reads the raw ticket (raw_ticket.v1) and writes intake.v1: the ticket's ids, a
// category and its topic (billing, technical, unclear), the customer's question and the
// facts it states, plus open questions for what the ticket leaves unknown. Offered routes,
// it answers the topic's. It never fills a missing id: a ticket without ticket_id or body
// fails the stage.
type intakeAgent struct{ card }

// NewIntake returns the intake agent (card "intake", tools tickets.get).
func NewIntake() agentrunner.Agent {
	return &intakeAgent{card{Name: StageIntake, Tools: []string{ToolTicketsGet}}}
}

var categories = []struct {
	name string
	re   *regexp.Regexp
}{
	{"billing_double_charge", regexp.MustCompile(`\b(charged twice|double[- ]?charged?|duplicate (charge|payment)|two charges|charged two times)\b`)},
	{"refund_request", regexp.MustCompile(`\brefund`)},
	{"account_access", regexp.MustCompile(`\b(password|log ?in|sign ?in|locked out|2fa|two-factor)\b`)},
	{"shipping", regexp.MustCompile(`\b(shipping|shipment|delivery|parcel|tracking|courier)\b`)},
	{"subscription", regexp.MustCompile(`\b(cancel|unsubscribe|subscription)\w*`)},
	{"technical", regexp.MustCompile(`\b(error|crash(es|ed|ing)?|bug|not working|broken|fails?|failing|app)\b`)},
}

// topics maps a category to the desk that handles it; any other is unclear.
var topics = map[string]string{
	"billing_double_charge": TopicBilling,
	"refund_request":        TopicBilling,
	"subscription":          TopicBilling,
	"account_access":        TopicTechnical,
	"technical":             TopicTechnical,
}

var reUrgent = regexp.MustCompile(`(?i)\b(urgent|asap|immediately|right away)\b`)

var (
	reInvoice  = regexp.MustCompile(`\b(?:INV|ORD|ORDER|INVOICE)-?\d+\b`)
	reAmount   = regexp.MustCompile(`[$€£]\s?\d+(?:[.,]\d{2})?`)
	reDate     = regexp.MustCompile(`(?i)\b\d{1,2}(?:st|nd|rd|th)? (?:january|february|march|april|may|june|july|august|september|october|november|december)\b|\b(?:january|february|march|april|may|june|july|august|september|october|november|december) \d{1,2}(?:st|nd|rd|th)?\b|\b\d{4}-\d{2}-\d{2}\b`)
	reTimezone = regexp.MustCompile(`(?i)\b(utc|gmt|cet|cest|est|edt|cst|cdt|pst|pdt|bst|ist|jst|aest|time ?zone)\b|[+-]\d{2}:\d{2}\b`)
	reTiming   = regexp.MustCompile(`(?i)\b(hours?|call|phone|chat|when|today|tomorrow|get back|asap|urgent)\b`)
	reTxnID    = regexp.MustCompile(`(?i)\b(?:txn|ch|pi|py)_[a-z0-9]+\b|\btransaction (?:id|number)\b|\blast (?:4|four) digits\b|\bending in \d{4}\b`)
	reQuestion = regexp.MustCompile(`[^.!?]*\?`)
)

// Run implements agentrunner.Agent.
func (a *intakeAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	src, data, err := readInput(ctx, in, TypeRawTicket)
	if err != nil {
		return nil, err
	}
	var t RawTicket
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("raw_ticket artifact is not valid raw_ticket.v1 JSON: %w", err)
	}
	t.TicketID, t.Body = strings.TrimSpace(t.TicketID), strings.TrimSpace(t.Body)
	if t.TicketID == "" {
		return nil, fmt.Errorf("raw_ticket (%s) has no ticket_id; intake does not invent one", src.GetUri())
	}
	if t.Body == "" && strings.TrimSpace(t.Subject) == "" {
		return nil, fmt.Errorf("raw_ticket %s has neither subject nor body", t.TicketID)
	}

	text := t.Subject + "\n" + t.Body
	lower := strings.ToLower(text)
	out := Intake{TicketID: t.TicketID, CustomerID: strings.TrimSpace(t.CustomerID), Category: "general"}
	for _, c := range categories {
		if c.re.MatchString(lower) {
			out.Category = c.name
			break
		}
	}
	out.Topic = topics[out.Category]
	if out.Topic == "" {
		out.Topic = TopicUnclear
	}
	out.Question = strings.TrimSpace(t.Subject)
	if q := reQuestion.FindString(t.Body); q != "" {
		out.Question = strings.TrimSpace(q)
	}

	facts := []string{}
	add := func(kind string, vals []string) {
		seen := map[string]bool{}
		for _, v := range vals {
			v = strings.TrimSpace(v)
			if v != "" && !seen[v] {
				seen[v] = true
				facts = append(facts, kind+": "+v)
			}
		}
	}
	if t.Channel != "" {
		add("channel", []string{t.Channel})
	}
	add("reference", reInvoice.FindAllString(text, -1))
	add("amount", reAmount.FindAllString(text, -1))
	add("date", reDate.FindAllString(text, -1))
	if out.Category == "billing_double_charge" {
		facts = append(facts, "customer reports: charged more than once for one purchase")
	}
	if strings.Contains(lower, "refund") {
		facts = append(facts, "customer asks about a refund")
	}
	out.Facts = facts

	var open []string
	if out.CustomerID == "" {
		open = append(open, "customer_id is missing from the ticket: the account cannot be looked up until it is known")
	}
	if !reTimezone.MatchString(text) && reTiming.MatchString(text) {
		open = append(open, "customer timezone is unknown: quote support hours in CET or ask the customer for their timezone")
	}
	if out.Category == "billing_double_charge" && !reTxnID.MatchString(text) {
		open = append(open, "no transaction id or last four card digits given: billing needs one to confirm which charge is the duplicate")
	}

	art, err := putJSON(ctx, in, TypeIntake, SchemaIntake, out)
	if err != nil {
		return nil, err
	}
	// Money taken twice, or a customer who says it is urgent, goes first.
	prio := handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL
	if out.Category == "billing_double_charge" || reUrgent.MatchString(text) {
		prio = handoffv1.RoutePriority_ROUTE_PRIORITY_HIGH
	}
	reason := fmt.Sprintf("category %s: a %s ticket", out.Category, out.Topic)
	if out.Topic == TopicUnclear {
		reason = fmt.Sprintf("category %s: neither a billing nor a technical ticket", out.Category)
	}
	return &handoffv1.StageResult{
		Artifacts: []*handoffv1.Artifact{art},
		ToolsTried: []*handoffv1.ToolAttempt{{
			Name: ToolTicketsGet, Ok: true, Stage: StageIntake,
			Detail: clip("read ticket "+t.TicketID+" ("+SchemaRawTicket+")", 500),
		}},
		SpentUsdMicros: SpendIntake,
		OpenQuestions:  questions(open...),
		NextHint:       clip("retrieve help-center articles for a "+out.Category+" ticket", 1000),
		Route:          choose(in, out.Topic, reason, prio),
	}, nil
}
