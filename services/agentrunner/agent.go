package agentrunner

import (
	"context"
	"slices"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/artifact"
)

// RoleCard is what an agent declares about itself: the role name a pipeline addresses it by
// (by default the stage name) and the tools it holds. The runner answers REJECTED_ROLE for a
// package whose stage needs a tool the card does not list.
type RoleCard struct {
	Name  string
	Tools []string
	// Accepts are the contract versions the agent reads ("handoff.v1", "handoff.v2"); empty:
	// those of the runner's validator. Read on every package, so a card may change them
	// while the runner serves (a rolling upgrade). Describe reports them.
	Accepts []string
}

// Holds reports whether the card lists tool.
func (c RoleCard) Holds(tool string) bool { return slices.Contains(c.Tools, tool) }

// Input is what an agent gets for one accepted package.
type Input struct {
	// Package is the validated package. Agents must not modify it.
	Package *handoffv1.HandoffPackage
	// V2 is the package as it came when the rail sent handoff.v2 (nil for a v1 package):
	// Package is then its v1 view (contract.V2ToV1). Agents must not modify it.
	V2 *handoffv2.HandoffPackage
	// Round is the number of judge verdicts the job has had (package.evaluator.rounds). An
	// agent stores its artifacts under this round, so a revision never overwrites the draft
	// a judge failed.
	Round uint32
	// Artifacts reads the package's artifacts and stores the agent's own.
	Artifacts artifact.Store
	// Routes are the routes the pipeline declares for the stage (DeliverRequest.routes). An
	// agent given routes answers with one of them in StageResult.route (with a short reason
	// and a priority); the rail escalates any other answer, and no answer. Without routes it
	// answers none. Package.origin says how the job came to this stage.
	Routes []*handoffv1.RouteOption
}

// Agent is one stage implementation hosted by the runner.
//
// Run is called only for a package that passed every gate, at most once per completion key
// at a time. It returns the stage's result; the runner fills job_id, stage, traceparent and
// status (COMPLETED) when the agent leaves them empty. An error (or a panic, or running past
// the stage timeout) turns into a STAGE_STATUS_FAILED result and the claim is released, so a
// retry runs the stage again. Run must honour ctx.
type Agent interface {
	Card() RoleCard
	Run(ctx context.Context, in Input) (*handoffv1.StageResult, error)
}

// Noop is an agent that does no work: spend 0, and at most one tiny artifact. It exists to
// measure what the rail itself costs per hop.
type Noop struct {
	Role RoleCard
	// WriteArtifact makes Run store a small "noop" artifact (noop.v1, text/plain) and return
	// it; otherwise the result carries no artifact.
	WriteArtifact bool
}

// NewNoop returns a Noop agent with the given card name and tools and no artifact.
func NewNoop(name string, tools ...string) *Noop {
	return &Noop{Role: RoleCard{Name: name, Tools: tools}}
}

// Card returns the Noop's role card.
func (n *Noop) Card() RoleCard { return n.Role }

// Run returns an empty completed result (plus the tiny artifact when WriteArtifact is set).
func (n *Noop) Run(ctx context.Context, in Input) (*handoffv1.StageResult, error) {
	res := &handoffv1.StageResult{}
	if n.WriteArtifact {
		p := in.Package
		a, err := in.Artifacts.Put(ctx, artifact.Ref{
			JobID: p.GetJobId(), Stage: p.GetStage(), Round: in.Round,
			Type: "noop", SchemaVersion: "noop.v1", MediaType: "text/plain",
		}, []byte("ok\n"))
		if err != nil {
			return nil, err
		}
		res.Artifacts = append(res.Artifacts, a)
	}
	return res, nil
}

// RunError is an agent error that still cost something: the FAILED result the runner sends
// carries its spend and tool attempts, so the rail debits the wallet for a model call whose
// output turned out unusable.
type RunError struct {
	Err            error
	SpentUsdMicros int64
	ToolsTried     []*handoffv1.ToolAttempt
}

func (e *RunError) Error() string { return e.Err.Error() }
func (e *RunError) Unwrap() error { return e.Err }

// Accepting returns a with its card declaring versions (RoleCard.Accepts) instead of its own.
func Accepting(a Agent, versions ...string) Agent {
	return accepting{Agent: a, versions: slices.Clone(versions)}
}

type accepting struct {
	Agent
	versions []string
}

func (a accepting) Card() RoleCard {
	c := a.Agent.Card()
	c.Accepts = slices.Clone(a.versions)
	return c
}
