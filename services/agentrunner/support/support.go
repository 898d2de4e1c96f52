// Package support holds the built-in deterministic agents of the support-ticket and
// support-triage pipelines:
//
//	intake   raw_ticket.v1  -> intake.v1   (holds tickets.get; classifies the topic)
//	retrieve intake.v1      -> chunks.v1   (holds kb.search; help-center corpus embedded)
//	draft    chunks.v1      -> summary_md.v1 (no tools; revises on judge failures)
//	judge    summary_md.v1  -> verdict.v1 + Evaluator (no tools; never writes externally)
//
// and the research-brief pipeline's (research.go): policy-lookup and history-lookup, which
// run in parallel, and brief, the merge that judges their results.
//
// Offered routes (support-triage), they choose by the ticket's content: intake routes by
// topic (billing, technical or unclear), retrieve by whether an article matched (hit or
// no_hit). A route they answer that the stage does not declare is the rail's to refuse. The
// drafter that a retriever's no_hit sent work to (the package's origin says so) writes a
// "no matching article" note that cites nothing, instead of failing.
//
// They need no model and no network, so a demo job runs the same way every time, including
// one honest critique loop: the first draft leaves one claim without its citation, the judge
// fails it with citation_missing, the revision adds it and the judge passes.
//
// Each agent reads its inputs from the package's artifacts by type (the newest artifact of
// the type wins), checks their sha256, writes its output with artifact.Store.Put under the
// package's job, stage and round, and reports a small fixed spend.
package support

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// Stage (and role card) names.
const (
	StageIntake   = "intake"
	StageRetrieve = "retrieve"
	StageDraft    = "draft"
	StageJudge    = "judge"
)

// Tools held by the role cards.
const (
	ToolTicketsGet = "tickets.get"
	ToolKBSearch   = "kb.search"
)

// Artifact types and their schema versions.
const (
	TypeRawTicket = "raw_ticket"
	TypeIntake    = "intake"
	TypeChunks    = "chunks"
	TypeSummary   = "summary_md"
	TypeVerdict   = "verdict"

	SchemaRawTicket = "raw_ticket.v1"
	SchemaIntake    = "intake.v1"
	SchemaChunks    = "chunks.v1"
	SchemaSummary   = "summary_md.v1"
	SchemaVerdict   = "verdict.v1"

	MediaJSON     = "application/json"
	MediaMarkdown = "text/markdown"
)

// Fixed spend per run, in micro-USD, so the job's wallet visibly decrements.
const (
	SpendIntake   int64 = 1500
	SpendRetrieve int64 = 2500
	SpendDraft    int64 = 4000
	SpendJudge    int64 = 3000
)

// Judge failure codes.
const (
	CodeCitationMissing  = "citation_missing"
	CodeCitationInvalid  = "citation_invalid"
	CodeRefundPromise    = "refund_promise"
	CodeConstraintBroken = "constraint_broken"
)

// RawTicket is the job's input artifact (raw_ticket.v1).
type RawTicket struct {
	TicketID   string `json:"ticket_id"`
	CustomerID string `json:"customer_id"`
	Subject    string `json:"subject"`
	Body       string `json:"body"`
	Channel    string `json:"channel"`
}

// Topics intake classifies a ticket into; in support-triage they are intake's routes.
const (
	TopicBilling   = "billing"
	TopicTechnical = "technical"
	TopicUnclear   = "unclear"
)

// Route names retrieve answers when the stage offers them.
const (
	RouteHit   = "hit"
	RouteNoHit = "no_hit"
)

// Intake is intake's output (intake.v1).
type Intake struct {
	TicketID   string `json:"ticket_id"`
	CustomerID string `json:"customer_id"`
	Category   string `json:"category"`
	// Topic is the desk the category belongs to: TopicBilling, TopicTechnical or
	// TopicUnclear (empty in artifacts written before topics).
	Topic    string   `json:"topic,omitempty"`
	Question string   `json:"question"`
	Facts    []string `json:"facts"`
}

// Chunk is one retrieved help-center passage.
type Chunk struct {
	// Key is the citation key ("hc-refund-policy").
	Key   string `json:"key"`
	Title string `json:"title"`
	Text  string `json:"text"`
	Score int    `json:"score,omitempty"`
}

// Chunks is retrieve's output (chunks.v1). NoHit is true, with no chunks, when nothing in
// the corpus matched the query.
type Chunks struct {
	Query  string  `json:"query,omitempty"`
	Chunks []Chunk `json:"chunks"`
	NoHit  bool    `json:"no_hit"`
}

// VerdictFailure is one failed criterion in a verdict artifact.
type VerdictFailure struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Verdict is judge's output artifact (verdict.v1).
type Verdict struct {
	// Verdict is "pass" or "fail".
	Verdict  string           `json:"verdict"`
	Failures []VerdictFailure `json:"failures"`
	// Round is the verdict's number (evaluator.rounds after it).
	Round uint32 `json:"round"`
	// Claims is how many claim lines the summary had; Cited the distinct keys it cited.
	Claims int      `json:"claims"`
	Cited  []string `json:"cited"`
	// Constraints the judge recognised and checked, and those it could not check.
	CheckedConstraints []string `json:"checked_constraints"`
	IgnoredConstraints []string `json:"ignored_constraints"`
}

//go:embed testdata/sample_ticket.json
var sampleTicket []byte

// SampleTicket returns the demo's input (raw_ticket.v1 JSON): a customer charged twice for
// one invoice who asks for a refund. The caller gets its own copy.
func SampleTicket() []byte { return bytes.Clone(sampleTicket) }

//go:embed testdata/tickets/*.json
var ticketFS embed.FS

// Ticket returns a sample ticket (raw_ticket.v1 JSON) by name: "billing" (SampleTicket),
// "technical" (locked out after a password reset), "unclear" (too vague for either desk)
// and "no-match" (a technical error no help-center article covers). The caller gets its
// own copy.
func Ticket(name string) ([]byte, error) {
	if name == TopicBilling {
		return SampleTicket(), nil
	}
	data, err := ticketFS.ReadFile("testdata/tickets/" + name + ".json")
	if err != nil {
		return nil, fmt.Errorf("no sample ticket %q (billing, technical, unclear, no-match)", name)
	}
	return data, nil
}

// Agents returns the four support agents (intake, retrieve, draft, judge) and the
// research-brief ones (policy-lookup, history-lookup, brief; research.go).
func Agents() []agentrunner.Agent {
	return append([]agentrunner.Agent{NewIntake(), NewRetrieve(), NewDraft(), NewJudge()}, ResearchAgents()...)
}

// latest returns the newest artifact of type typ in the package (the rail appends, so the
// last one), or nil.
func latest(p *handoffv1.HandoffPackage, typ string) *handoffv1.Artifact {
	arts := p.GetArtifacts()
	for i := len(arts) - 1; i >= 0; i-- {
		if arts[i].GetType() == typ {
			return arts[i]
		}
	}
	return nil
}

var errNoArtifact = errors.New("missing input artifact")

// readInput reads the newest artifact of type typ and checks its digest.
func readInput(ctx context.Context, in agentrunner.Input, typ string) (*handoffv1.Artifact, []byte, error) {
	a := latest(in.Package, typ)
	if a == nil {
		return nil, nil, fmt.Errorf("%w: the package carries no %q artifact", errNoArtifact, typ)
	}
	if in.Artifacts == nil {
		return nil, nil, errors.New("no artifact store")
	}
	data, err := in.Artifacts.Get(ctx, a.GetUri())
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s artifact: %w", typ, err)
	}
	if err := artifact.Verify(a, data); err != nil {
		return nil, nil, err
	}
	return a, data, nil
}

// readJSON reads the newest artifact of type typ into v.
func readJSON(ctx context.Context, in agentrunner.Input, typ string, v any) error {
	a, data, err := readInput(ctx, in, typ)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s artifact (%s) is not valid %s JSON: %w", typ, a.GetUri(), a.GetSchemaVersion(), err)
	}
	return nil
}

// put stores the stage's output under the package's job, stage and round.
func put(ctx context.Context, in agentrunner.Input, typ, schema, media string, data []byte) (*handoffv1.Artifact, error) {
	return in.Artifacts.Put(ctx, artifact.Ref{
		JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: typ, SchemaVersion: schema, MediaType: media,
	}, data)
}

func putJSON(ctx context.Context, in agentrunner.Input, typ, schema string, v any) (*handoffv1.Artifact, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return put(ctx, in, typ, schema, MediaJSON, append(data, '\n'))
}

// clip shortens s to at most n bytes without splitting a rune.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-3], "") + "..."
}

// questions dedupes, drops empties and caps open questions to what a package accepts
// (at most 32, each 1..500 bytes).
func questions(qs ...string) []string {
	var out []string
	seen := map[string]bool{}
	for _, q := range qs {
		q = clip(strings.TrimSpace(q), 500)
		if q == "" || seen[q] {
			continue
		}
		seen[q] = true
		out = append(out, q)
		if len(out) == 32 {
			break
		}
	}
	return out
}

// choose picks the route named name when the stage offers routes: nil when it offers none.
// An offered set without that name still gets the answer, which the rail refuses
// (ROUTE_UNDECLARED): an agent does not pick another route instead.
func choose(in agentrunner.Input, name, reason string, prio handoffv1.RoutePriority) *handoffv1.RouteChoice {
	if len(in.Routes) == 0 {
		return nil
	}
	return &handoffv1.RouteChoice{Name: name, Reason: clip(reason, 500), Priority: prio}
}

// card is the shared Card implementation.
type card agentrunner.RoleCard

func (c card) Card() agentrunner.RoleCard {
	return agentrunner.RoleCard{Name: c.Name, Tools: append([]string(nil), c.Tools...)}
}
