// Package pipeline reads, checks and loads pipeline files: the declared stages a job runs
// through, with each stage's input, typed and versioned output artifact, allowed tools,
// writer and evaluator criteria.
//
// A pipeline is linted before it runs. Besides the structure (strict fields, names, kinds),
// Lint enforces the rules of the interface-first design table:
//
//   - one-stage: two stages that hold the same tools and the same criteria are one stage;
//   - artifact-type: every stage names its output artifact type;
//   - artifact-version: every output artifact has a schema version (type.vN);
//   - one-writer: exactly one writeback stage per external system, and only that stage
//     holds write tools for the system;
//   - judge-no-write: a judge holds no write tools;
//   - writeback-gate: a writeback stage runs only after a judge's PASS;
//   - max-hops: a job has a hop cap, after which it escalates.
//
// A stage may declare routes: named outcomes its agent chooses among, each going to another
// stage, to escalate, or to the end of the job. The graph rules:
//
//   - route-target: every route (and next:, rejected_role:) names a stage, escalate or end;
//   - reachable: every stage is reachable from the first;
//   - writeback-gate: a writeback stage is reachable only through a judge's PASS;
//   - duplicate-route: route names are unique within a stage;
//   - cycle: a cycle that passes through no judge is reported (an error when nothing but
//     fixed moves form it, so a job could never leave it; a warning when a route choice
//     does, which max_bounces and the hop cap bound at run time);
//   - route-end: a route ends the job only where no write is owed.
//
// Parallel stages, merges and sub-jobs (parallel.go) have their own rules: hard partitions
// between branches (partition-output, partition-write-tool, partition-writer,
// branch-writes, partition), a merge right after each parallel stage (merge), and a
// self-contained sub-job task (subjob; CheckSubJobs against the pipeline it names).
//
// Parse returns every problem at once with its file, line and column; Load and LoadFS
// refuse a pipeline that has any error-severity problem.
package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/handoffhq/handoff/internal/pii"
)

// Stage kinds.
const (
	// KindAgent is an ordinary stage: an agent reads the input and writes the output.
	KindAgent = "agent"
	// KindJudge evaluates the stage before it against its criteria and returns a verdict;
	// a FAIL goes back to the stage named by Revise.
	KindJudge = "judge"
	// KindWriteback is the one stage that writes to an external system (Writer.System),
	// through the writeback service, after a judge passed.
	KindWriteback = "writeback"
)

// Tool access levels.
const (
	AccessRead  = "read"
	AccessWrite = "write"
)

// Pipeline is a parsed pipeline file.
type Pipeline struct {
	// Name identifies the pipeline (SubmitJob's pipeline field).
	Name        string
	Description string
	// MaxHops caps the hops of a job; after that many the job escalates.
	MaxHops int
	// MaxRevisions is how many judge FAILs are sent back for revision before the job
	// escalates.
	MaxRevisions int
	// MaxBounces is how often a job may be handed back between the same two stages before
	// it escalates (PING_PONG): A to B is a transfer, each further transfer between A and B
	// a bounce. Parse sets DefaultMaxBounces when the file leaves it out.
	MaxBounces int
	// StaleRevision is what the rail does with a revision byte-identical (same sha256) to
	// the draft the judge rejected: StaleRevise (the default) sends it back to the reviser
	// once with the failure "revision identical to the rejected draft", and escalates
	// STALE_PLAN if it comes back identical again; StaleEscalate escalates STALE_PLAN at
	// once ("" is StaleRevise). Either way it never goes to the judge again.
	StaleRevision string
	// OnWalletEmpty is what branches still running do when the wallet empties
	// (WalletEmptyFinish, the default, or WalletEmptyStop).
	OnWalletEmpty string
	Escalation    Escalation
	// PII is what the coordinator does with personal data in a job's free text (pii:).
	PII PII
	// MCPServers are the tool servers the catalogue's tools are served by.
	MCPServers []MCPServer
	// Prices is the model price table of its model stages, in integer micro-USD.
	Prices []Price
	// Tools is the catalogue: every tool a stage may hold.
	Tools []Tool
	// Stages run in this order.
	Stages []Stage
	// Source is the file the pipeline was read from (as given to Parse).
	Source string

	// pos maps a field path ("stages[2].output.schema_version") to its place in Source.
	pos map[string]position
	// bad holds the paths that already have a decode problem, so Lint does not report
	// the same field twice.
	bad map[string]bool
}

// Escalation says where jobs go when the rail stops them.
type Escalation struct {
	// Route is where escalations go ("support-leads").
	Route string
	// MaxGrant is the most a person may give a run's wallet in one return to a stage
	// (escalation.max_grant). Zero, the default, lets no grant of that kind.
	MaxGrant Grant
	// MaxOpen is how many of the pipeline's runs may wait ESCALATED at once
	// (escalation.max_open_escalations): past it, intake sheds load (SubmitJob answers
	// RESOURCE_EXHAUSTED with a RetryInfo delay) until the desk has worked some off. 0: no cap.
	MaxOpen int
	// WhenFull is what intake does with a new job once MaxOpen is reached
	// (escalation.when_full): WhenFullShed (the default) refuses it, WhenFullHuman hands it
	// straight to a person without agent spend.
	WhenFull string
	// Webhook, when set, is POSTed each escalation (escalation.webhook, an http(s) URL).
	Webhook string
}

// PII is a pipeline's personal-data policy (the pii: block). The built-in detectors (e-mail,
// phone, Luhn-checked card numbers; package pii) always run; Patterns add the pipeline's own.
type PII struct {
	// Policy is PIIReject (the default) or PIIRedact.
	Policy string
	// Patterns are extra detectors: name (the finding's kind) and an RE2 regex.
	Patterns []pii.Pattern
}

// PII.Policy values.
const (
	// PIIReject refuses a job (SubmitJob InvalidArgument) or a stage result whose free text
	// holds personal data, naming the field, never the value.
	PIIReject = "reject"
	// PIIRedact keeps each value in the coordinator's vault and puts its ref ("pii:<id>") in
	// its place.
	PIIRedact = "redact"
)

// PIIPolicy is the policy in force: Policy, or PIIReject when the file leaves it out.
func (p *Pipeline) PIIPolicy() string {
	if p.PII.Policy == "" {
		return PIIReject
	}
	return p.PII.Policy
}

// PIIDetector is the detector of the pipeline's pii block: the built-in detectors and its
// patterns. A pipeline that passed Lint always has one; the error is for one built in code.
func (p *Pipeline) PIIDetector() (*pii.Detector, error) { return pii.New(p.PII.Patterns...) }

// Escalation.WhenFull values.
const (
	WhenFullShed  = "shed"
	WhenFullHuman = "human"
)

// Grant is an amount of hops, revisions and money (micro-dollars).
type Grant struct {
	Hops, Revisions int
	USDMicros       int64
}

// Tool is one entry of the tool catalogue.
type Tool struct {
	Name string
	// Access is AccessRead or AccessWrite.
	Access string
	// System is the external system the tool reads or writes ("crm").
	System string
	// MCP says which MCP server and tool serve it, for model stages (llmagent); nil when
	// the tool is implemented by the agent itself.
	MCP *MCPTool
}

// Price is what 1000 tokens of one model cost, in micro-USD.
type Price struct {
	Model                                    string
	PromptMicrosPer1K, CompletionMicrosPer1K int
}

// MCPTool is a catalogue tool's place on an MCP server.
type MCPTool struct {
	// Server is the name of one of the pipeline's MCPServers; Tool the tool's name there.
	Server, Tool string
}

// MCPServer is a Model Context Protocol tool server: a command run over stdio, or a
// streamable-HTTP URL. Exactly one of Command and URL is set.
type MCPServer struct {
	Name    string
	Command []string
	URL     string
}

// Stage is one declared stage.
type Stage struct {
	Name string
	// Agent is the agent (role) name on the runner; empty means the stage name
	// (see AgentName).
	Agent string
	// Kind is KindAgent, KindJudge or KindWriteback. Parse sets KindAgent when the file
	// leaves it out.
	Kind string
	// Input is the schema version of the artifact this stage reads ("chunks.v1").
	Input string
	// Revise is, for a judge, the earlier stage that gets a FAIL's failures back (the first
	// of Revisers when the file lists several).
	Revise string
	// Revisers are, for a judge fed by several stages, every stage it sends a FAIL back to:
	// the one the judged work came from. Empty when revise names one stage.
	Revisers []string
	// Routes are the named outcomes the stage's agent chooses among; without routes the job
	// moves on to Next, else to the next stage in file order.
	Routes []Route
	// Next is the stage after this one when it is not the next in file order (a stage with
	// routes has none: its routes decide).
	Next string
	// RejectedRole is the stage the rail reroutes to, once, when this stage's runner answers
	// REJECTED_ROLE (for another runner, a stage with the same agent and its own runner:).
	RejectedRole string
	// Runner is the optional host:port of a remote agent runner for this stage.
	Runner string
	// Output is the artifact the stage produces.
	Output Output
	// Tools are the catalogue tools the stage holds (its role card).
	Tools []string
	// Criteria are the evaluator criteria codes for the stage's output.
	Criteria []string
	// Writer is set on writeback stages only.
	Writer *Writer
	// Instructions are what a model stage is told to do (the heart of its system
	// prompt); empty: the agent's own.
	Instructions string
	// MaxToolRounds bounds a model stage's rounds of tool calls; 0: the agent's default.
	MaxToolRounds int
	// Branches are a parallel stage's branches (parallel.go).
	Branches []Branch
	// OnBranchFailure is a parallel stage's policy for a failed or timed-out branch
	// (BranchFailEscalate when empty; see BranchFailure).
	OnBranchFailure string
	// BranchTimeout bounds each branch of a parallel stage (DefaultBranchTimeout when zero).
	BranchTimeout time.Duration
	// Judge makes a merge stage also the judge: its verdict gates the writeback.
	Judge bool
	// SubJob is a subjob stage's task.
	SubJob *SubJob
	// Line is the stage's line in Source (0 when the stage was not parsed from a file).
	Line int
}

// Route targets besides a stage name.
const (
	// ToEscalate hands the job to a person (the pipeline's escalation route).
	ToEscalate = "escalate"
	// ToEnd completes the job: only where no write is owed.
	ToEnd = "end"
)

// StaleRevision values (stale_revision:).
const (
	StaleRevise   = "revise"
	StaleEscalate = "escalate"
)

// DefaultMaxBounces is MaxBounces when a file does not set it.
const DefaultMaxBounces = 2

// Route is one outcome a stage's agent may choose.
type Route struct {
	// Name is what the agent answers ("billing", "no_hit").
	Name string
	// Description says when to choose it; for a model stage it becomes the text of its
	// transfer tool.
	Description string
	// To is a stage name, ToEscalate or ToEnd.
	To string
}

// Output is a stage's output artifact.
type Output struct {
	// Type is the artifact type, one noun ("summary_md").
	Type string
	// SchemaVersion is the version of the artifact's schema ("summary_md.v1").
	SchemaVersion string
	// JSONSchema, when set, is the path (relative to the pipeline file) of a JSON Schema
	// the artifact must satisfy; a model stage's output is checked against it before it
	// leaves the runner.
	JSONSchema string
}

// Writer names the external system a writeback stage writes and the writeback service
// target that performs the write.
type Writer struct {
	System string
	Target string
}

// Severity of a problem.
const (
	// SeverityError problems make Load refuse the pipeline and `handoff lint` fail.
	SeverityError = "error"
	// SeverityWarning problems are reported but do not stop the pipeline.
	SeverityWarning = "warning"
)

// Problem is one broken rule, at the YAML node that breaks it.
type Problem struct {
	File string
	// Line and Col are 1-based; 0 when unknown (a pipeline built in code).
	Line, Col int
	// Rule is the kebab-case rule id ("one-writer").
	Rule    string
	Message string
	// Severity is SeverityError (the zero value counts as an error) or SeverityWarning.
	Severity string
}

// IsError reports whether the problem stops the pipeline from loading.
func (pr Problem) IsError() bool { return pr.Severity != SeverityWarning }

// String formats the problem as "file:line:col: rule: message". Warnings carry
// "warning: " in front of the message.
func (pr Problem) String() string {
	file := pr.File
	if file == "" {
		file = "pipeline"
	}
	msg := pr.Message
	if !pr.IsError() {
		msg = "warning: " + msg
	}
	if pr.Line <= 0 {
		return fmt.Sprintf("%s: %s: %s", file, pr.Rule, msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s: %s", file, pr.Line, max(pr.Col, 1), pr.Rule, msg)
}

// HasErrors reports whether any problem is error-severity.
func HasErrors(problems []Problem) bool {
	return slices.ContainsFunc(problems, Problem.IsError)
}

// Error is returned by Load and friends when a pipeline has error-severity problems. Its
// message lists every problem, one per line.
type Error struct {
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	n := 0
	for _, p := range e.Problems {
		if p.IsError() {
			n++
		}
	}
	fmt.Fprintf(&b, "pipeline %s has %d %s:", e.File, n, plural(n, "problem", "problems"))
	for _, p := range e.Problems {
		b.WriteString("\n")
		b.WriteString(p.String())
	}
	return b.String()
}

// SyntaxError is a file that is not valid YAML.
type SyntaxError struct {
	File string
	// Line is 1-based; 0 when the YAML parser did not say.
	Line int
	Msg  string
}

// Problem returns the syntax error as a problem with rule "yaml-syntax".
func (e *SyntaxError) Problem() Problem {
	return Problem{File: e.File, Line: e.Line, Col: 1, Rule: "yaml-syntax", Message: e.Msg}
}

func (e *SyntaxError) Error() string { return e.Problem().String() }

// Stage returns the stage with the given name and its index.
func (p *Pipeline) Stage(name string) (*Stage, int, bool) {
	for i := range p.Stages {
		if p.Stages[i].Name == name {
			return &p.Stages[i], i, true
		}
	}
	return nil, -1, false
}

// First returns the first stage, or nil when there is none.
func (p *Pipeline) First() *Stage {
	if len(p.Stages) == 0 {
		return nil
	}
	return &p.Stages[0]
}

// Next returns the stage after the named one when its agent chooses no route: the stage
// its next: names, else the next in declared order. It returns false when name is the last
// stage (and names no next:) or not a stage.
func (p *Pipeline) Next(name string) (*Stage, bool) {
	st, i, ok := p.Stage(name)
	if !ok {
		return nil, false
	}
	if st.Next != "" {
		n, _, ok := p.Stage(st.Next)
		return n, ok
	}
	if i+1 >= len(p.Stages) {
		return nil, false
	}
	return &p.Stages[i+1], true
}

// HasRoutes reports whether any stage declares routes.
func (p *Pipeline) HasRoutes() bool {
	return slices.ContainsFunc(p.Stages, func(s Stage) bool { return len(s.Routes) > 0 })
}

// Writes reports whether the pipeline has a writeback stage: a job of it owes a write
// until it has a receipt.
func (p *Pipeline) Writes() bool {
	return slices.ContainsFunc(p.Stages, func(s Stage) bool { return s.IsWriteback() })
}

// Tool returns the catalogue entry for a tool name.
func (p *Pipeline) Tool(name string) (Tool, bool) {
	for _, t := range p.Tools {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

// ToolsOf returns the catalogue entries of the tools the stage holds, in the stage's
// order. Names missing from the catalogue are left out (Lint reports them).
func (p *Pipeline) ToolsOf(s *Stage) []Tool {
	var out []Tool
	for _, name := range s.Tools {
		if t, ok := p.Tool(name); ok {
			out = append(out, t)
		}
	}
	return out
}

// AgentName is the agent (role) that serves the stage: Agent, or the stage name.
func (s *Stage) AgentName() string {
	if s.Agent != "" {
		return s.Agent
	}
	return s.Name
}

// Route returns the declared route with the given name.
func (s *Stage) Route(name string) (Route, bool) {
	for _, r := range s.Routes {
		if r.Name == name {
			return r, true
		}
	}
	return Route{}, false
}

// RouteNames lists the stage's route names in declared order.
func (s *Stage) RouteNames() []string {
	out := make([]string, len(s.Routes))
	for i, r := range s.Routes {
		out[i] = r.Name
	}
	return out
}

// ReviseStages lists the stages a judge sends a FAIL back to: Revisers, or Revise alone.
func (s *Stage) ReviseStages() []string {
	if len(s.Revisers) > 0 {
		return s.Revisers
	}
	if s.Revise != "" {
		return []string{s.Revise}
	}
	return nil
}

// IsJudge reports whether the stage is a judge.
func (s *Stage) IsJudge() bool { return s.Kind == KindJudge }

// IsWriteback reports whether the stage is a writeback stage.
func (s *Stage) IsWriteback() bool { return s.Kind == KindWriteback }

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
