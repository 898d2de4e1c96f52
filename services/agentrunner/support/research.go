package support

import (
	"context"
	"fmt"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// The research-brief pipeline's agents: two specialists that run in parallel and the merge
// that judges what they found.
//
//	policy-lookup   raw_ticket.v1 -> policy_notes.v1     (holds policy.search)
//	history-lookup  raw_ticket.v1 -> account_history.v1  (holds accounts.history)
//	brief           every branch result -> brief.v1 + verdict (merge judge, no tools)
//
// Like the support agents they need no model and no network: the policy table and the
// account history are fixed, so a demo run is the same every time.

// research-brief stage names, tools, types and spend.
const (
	StagePolicyLookup  = "policy-lookup"
	StageHistoryLookup = "history-lookup"
	StageBrief         = "brief"

	ToolPolicySearch   = "policy.search"
	ToolAccountHistory = "accounts.history"

	TypePolicyNotes    = "policy_notes"
	TypeAccountHistory = "account_history"
	TypeBrief          = "brief"

	SchemaPolicyNotes    = "policy_notes.v1"
	SchemaAccountHistory = "account_history.v1"
	SchemaBrief          = "brief.v1"

	SpendPolicy  int64 = 2000
	SpendHistory int64 = 1500
	SpendBrief   int64 = 2500

	// CodeBranchMissing is the brief judge's failure when a branch's result is missing.
	CodeBranchMissing = "branch_missing"
)

// PolicyNotes is policy-lookup's output (policy_notes.v1).
type PolicyNotes struct {
	TicketID string   `json:"ticket_id"`
	Policies []Policy `json:"policies"`
}

// Policy is one policy clause that applies to the ticket.
type Policy struct {
	Key  string `json:"key"`
	Text string `json:"text"`
}

// AccountHistory is history-lookup's output (account_history.v1).
type AccountHistory struct {
	CustomerID string   `json:"customer_id"`
	Events     []string `json:"events"`
}

// policies is the fixed policy table: a clause applies when the ticket mentions a word.
var policies = []struct {
	words []string
	p     Policy
}{
	{[]string{"charge", "charged", "refund", "invoice", "payment"}, Policy{"pol-duplicate-charge", "A duplicate charge is reversed to the original payment method after billing confirms it; agents do not promise refunds."}},
	{[]string{"cancel", "subscription"}, Policy{"pol-cancellation", "A cancellation takes effect at the end of the billing period."}},
	{[]string{"password", "login", "sign in", "locked"}, Policy{"pol-account-access", "Account access is restored only after identity verification."}},
}

type policyAgent struct{ card }
type historyAgent struct{ card }
type briefAgent struct{ card }

// NewPolicyLookup returns policy-lookup (card "policy-lookup", tools policy.search).
func NewPolicyLookup() agentrunner.Agent {
	return &policyAgent{card{Name: StagePolicyLookup, Tools: []string{ToolPolicySearch}}}
}

// NewHistoryLookup returns history-lookup (card "history-lookup", tools accounts.history).
func NewHistoryLookup() agentrunner.Agent {
	return &historyAgent{card{Name: StageHistoryLookup, Tools: []string{ToolAccountHistory}}}
}

// NewBrief returns the brief merge judge (card "brief", no tools).
func NewBrief() agentrunner.Agent { return &briefAgent{card{Name: StageBrief}} }

// ResearchAgents returns the research-brief agents.
func ResearchAgents() []agentrunner.Agent {
	return []agentrunner.Agent{NewPolicyLookup(), NewHistoryLookup(), NewBrief()}
}

// Run implements agentrunner.Agent.
func (a *policyAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	var t RawTicket
	if err := readJSON(ctx, in, TypeRawTicket, &t); err != nil {
		return nil, err
	}
	text := strings.ToLower(t.Subject + " " + t.Body)
	notes := PolicyNotes{TicketID: t.TicketID, Policies: []Policy{}}
	for _, p := range policies {
		for _, w := range p.words {
			if strings.Contains(text, w) {
				notes.Policies = append(notes.Policies, p.p)
				break
			}
		}
	}
	art, err := putJSON(ctx, in, TypePolicyNotes, SchemaPolicyNotes, notes)
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{art}, SpentUsdMicros: SpendPolicy,
		ToolsTried: []*handoffv1.ToolAttempt{{Name: ToolPolicySearch, Ok: true, Stage: in.Package.GetStage()}}}, nil
}

// Run implements agentrunner.Agent.
func (a *historyAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	var t RawTicket
	if err := readJSON(ctx, in, TypeRawTicket, &t); err != nil {
		return nil, err
	}
	if t.CustomerID == "" {
		return nil, fmt.Errorf("the ticket names no customer_id: there is no account history to look up")
	}
	h := AccountHistory{CustomerID: t.CustomerID, Events: []string{
		"customer since 2023-04",
		"2 invoices in the last 30 days",
		"no refund issued in the last 12 months",
	}}
	art, err := putJSON(ctx, in, TypeAccountHistory, SchemaAccountHistory, h)
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{art}, SpentUsdMicros: SpendHistory,
		ToolsTried: []*handoffv1.ToolAttempt{{Name: ToolAccountHistory, Ok: true, Stage: in.Package.GetStage()}}}, nil
}

// Run implements agentrunner.Agent: it reads each branch's result by branch, writes the
// brief and judges it: PASS when the policy and history branches both returned and at
// least one policy applies, FAIL (branch_missing) otherwise.
func (a *briefAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	var notes PolicyNotes
	var hist AccountHistory
	var fails []*handoffv1.Failure
	got := map[string]bool{}
	for _, r := range in.Package.GetBranchResults() {
		got[r.GetBranch()] = true
	}
	for _, b := range []string{"policy", "history"} {
		if !got[b] {
			fails = append(fails, &handoffv1.Failure{Code: CodeBranchMissing, Detail: fmt.Sprintf("branch %s returned no result", b)})
		}
	}
	if got["policy"] {
		if err := readJSON(ctx, in, TypePolicyNotes, &notes); err != nil {
			return nil, err
		}
		if len(notes.Policies) == 0 {
			fails = append(fails, &handoffv1.Failure{Code: CodeBranchMissing, Detail: "no policy applies to the ticket"})
		}
	}
	if got["history"] {
		if err := readJSON(ctx, in, TypeAccountHistory, &hist); err != nil {
			return nil, err
		}
	}
	var b strings.Builder
	b.WriteString("# Research brief\n\n## Policy\n")
	for _, p := range notes.Policies {
		fmt.Fprintf(&b, "- %s [%s]\n", p.Text, p.Key)
	}
	fmt.Fprintf(&b, "\n## Account %s\n", hist.CustomerID)
	for _, e := range hist.Events {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	art, err := put(ctx, in, TypeBrief, SchemaBrief, MediaMarkdown, []byte(b.String()))
	if err != nil {
		return nil, err
	}
	ev := &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: in.Round + 1}
	if len(fails) > 0 {
		ev.LastVerdict, ev.Failures = handoffv1.Verdict_VERDICT_FAIL, fails
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{art}, Evaluator: ev, SpentUsdMicros: SpendBrief}, nil
}
