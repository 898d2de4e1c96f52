package contract

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

// Conversion between the versions, for dual-write while consumers move from handoff.v1 to
// handoff.v2. The field copies are written out by hand (not via the wire format) because
// field 11 changes type between the versions and because the compiler then catches a field
// added to one version and forgotten here.

// V1ToV2 converts a handoff.v1 package into handoff.v2. deadline is the budget deadline v1
// lacks; a zero deadline is an error (inventing one would hand the job a wallet it never had).
// memory_refs "kind:id" are split at the first ':', so ids may contain ':'; tools_tried
// becomes tool_attempts. The input is not modified; nothing is shared with it. Errors name the
// field that cannot be represented.
func V1ToV2(p *handoffv1.HandoffPackage, deadline time.Time) (*handoffv2.HandoffPackage, error) {
	if p == nil {
		return nil, errors.New("contract: V1ToV2: nil package")
	}
	if p.GetSchema() != V1 {
		return nil, fmt.Errorf("contract: V1ToV2: schema: %q is not %s", p.GetSchema(), V1)
	}
	if deadline.IsZero() {
		return nil, errors.New("contract: V1ToV2: budget.deadline: v2 requires a deadline and none was given")
	}
	dl := timestamppb.New(deadline)
	if err := dl.CheckValid(); err != nil {
		return nil, fmt.Errorf("contract: V1ToV2: budget.deadline: %w", err)
	}
	if p.GetBudget() == nil {
		return nil, errors.New("contract: V1ToV2: budget: the v1 package has no budget to carry the deadline")
	}
	out := &handoffv2.HandoffPackage{
		Schema:          V2,
		JobId:           p.GetJobId(),
		Stage:           p.GetStage(),
		Goal:            p.GetGoal(),
		Constraints:     cloneStrings(p.GetConstraints()),
		OpenQuestions:   cloneStrings(p.GetOpenQuestions()),
		NextHint:        p.GetNextHint(),
		OperatorReturns: p.GetOperatorReturns(),
		Visit:           p.GetVisit(),
		Budget: &handoffv2.Budget{
			UsdRemainingMicros: p.GetBudget().GetUsdRemainingMicros(),
			Deadline:           dl,
			RevisionsRemaining: p.GetBudget().GetRevisionsRemaining(),
			HopsRemaining:      p.GetBudget().GetHopsRemaining(),
			WalletId:           p.GetBudget().GetWalletId(),
		},
	}
	for i, a := range p.GetArtifacts() {
		if a == nil {
			return nil, fmt.Errorf("contract: V1ToV2: artifacts[%d]: nil", i)
		}
		out.Artifacts = append(out.Artifacts, artifactV2(a))
	}
	for _, b := range p.GetBranchResults() {
		r := &handoffv2.BranchResult{Branch: b.GetBranch()}
		for _, a := range b.GetArtifacts() {
			r.Artifacts = append(r.Artifacts, artifactV2(a))
		}
		out.BranchResults = append(out.BranchResults, r)
	}
	for i, t := range p.GetToolsTried() {
		if t == nil {
			return nil, fmt.Errorf("contract: V1ToV2: tools_tried[%d]: nil", i)
		}
		out.ToolAttempts = append(out.ToolAttempts, &handoffv2.ToolAttempt{
			Name: t.GetName(), Ok: t.GetOk(), ErrorCode: t.GetErrorCode(), Stage: t.GetStage(), Detail: t.GetDetail(),
		})
	}
	if e := p.GetEvaluator(); e != nil {
		ev := &handoffv2.Evaluator{LastVerdict: handoffv2.Verdict(e.GetLastVerdict()), Rounds: e.GetRounds()}
		for i, f := range e.GetFailures() {
			if f == nil {
				return nil, fmt.Errorf("contract: V1ToV2: evaluator.failures[%d]: nil", i)
			}
			ev.Failures = append(ev.Failures, &handoffv2.Failure{Code: f.GetCode(), Detail: f.GetDetail()})
		}
		out.Evaluator = ev
	}
	for i, r := range p.GetMemoryRefs() {
		kind, id, ok := strings.Cut(r, ":")
		if !ok {
			return nil, fmt.Errorf("contract: V1ToV2: memory_refs[%d]: %q is not \"kind:id\"", i, r)
		}
		out.MemoryRefs = append(out.MemoryRefs, &handoffv2.MemoryRef{Kind: kind, Id: id})
	}
	if t := p.GetTrace(); t != nil {
		out.Trace = &handoffv2.Trace{Traceparent: t.GetTraceparent(), Tracestate: t.GetTracestate()}
	}
	if o := p.GetOrigin(); o != nil {
		out.Origin = &handoffv2.Origin{Stage: o.GetStage(), Move: handoffv2.Move(o.GetMove())}
		if r := o.GetRoute(); r != nil {
			out.Origin.Route = &handoffv2.RouteChoice{Name: r.GetName(), Reason: r.GetReason(), Priority: handoffv2.RoutePriority(r.GetPriority())}
		}
	}
	return out, nil
}

// V2ToV1 converts a handoff.v2 package into handoff.v1, dropping budget.deadline (v1 has no
// field for it: a v1 consumer of a dual-written job is not held to the deadline).
// memory_refs become "kind:id"; a kind containing ':' is an error, because v1 readers split
// at the first ':' and would read a different kind. tool_attempts becomes tools_tried. The
// input is not modified; nothing is shared with it.
func V2ToV1(p *handoffv2.HandoffPackage) (*handoffv1.HandoffPackage, error) {
	if p == nil {
		return nil, errors.New("contract: V2ToV1: nil package")
	}
	if p.GetSchema() != V2 {
		return nil, fmt.Errorf("contract: V2ToV1: schema: %q is not %s", p.GetSchema(), V2)
	}
	out := &handoffv1.HandoffPackage{
		Schema:          V1,
		JobId:           p.GetJobId(),
		Stage:           p.GetStage(),
		Goal:            p.GetGoal(),
		Constraints:     cloneStrings(p.GetConstraints()),
		OpenQuestions:   cloneStrings(p.GetOpenQuestions()),
		NextHint:        p.GetNextHint(),
		OperatorReturns: p.GetOperatorReturns(),
		Visit:           p.GetVisit(),
	}
	if b := p.GetBudget(); b != nil {
		out.Budget = &handoffv1.Budget{
			UsdRemainingMicros: b.GetUsdRemainingMicros(),
			RevisionsRemaining: b.GetRevisionsRemaining(),
			HopsRemaining:      b.GetHopsRemaining(),
			WalletId:           b.GetWalletId(),
		}
	}
	for i, a := range p.GetArtifacts() {
		if a == nil {
			return nil, fmt.Errorf("contract: V2ToV1: artifacts[%d]: nil", i)
		}
		out.Artifacts = append(out.Artifacts, artifactV1(a))
	}
	for _, b := range p.GetBranchResults() {
		r := &handoffv1.BranchResult{Branch: b.GetBranch()}
		for _, a := range b.GetArtifacts() {
			r.Artifacts = append(r.Artifacts, artifactV1(a))
		}
		out.BranchResults = append(out.BranchResults, r)
	}
	for i, t := range p.GetToolAttempts() {
		if t == nil {
			return nil, fmt.Errorf("contract: V2ToV1: tool_attempts[%d]: nil", i)
		}
		out.ToolsTried = append(out.ToolsTried, &handoffv1.ToolAttempt{
			Name: t.GetName(), Ok: t.GetOk(), ErrorCode: t.GetErrorCode(), Stage: t.GetStage(), Detail: t.GetDetail(),
		})
	}
	if e := p.GetEvaluator(); e != nil {
		ev := &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict(e.GetLastVerdict()), Rounds: e.GetRounds()}
		for i, f := range e.GetFailures() {
			if f == nil {
				return nil, fmt.Errorf("contract: V2ToV1: evaluator.failures[%d]: nil", i)
			}
			ev.Failures = append(ev.Failures, &handoffv1.Failure{Code: f.GetCode(), Detail: f.GetDetail()})
		}
		out.Evaluator = ev
	}
	for i, r := range p.GetMemoryRefs() {
		if r == nil {
			return nil, fmt.Errorf("contract: V2ToV1: memory_refs[%d]: nil", i)
		}
		if strings.Contains(r.GetKind(), ":") {
			return nil, fmt.Errorf("contract: V2ToV1: memory_refs[%d].kind: %q contains ':' and cannot be written as v1 \"kind:id\"", i, r.GetKind())
		}
		out.MemoryRefs = append(out.MemoryRefs, r.GetKind()+":"+r.GetId())
	}
	if t := p.GetTrace(); t != nil {
		out.Trace = &handoffv1.Trace{Traceparent: t.GetTraceparent(), Tracestate: t.GetTracestate()}
	}
	if o := p.GetOrigin(); o != nil {
		out.Origin = &handoffv1.Origin{Stage: o.GetStage(), Move: handoffv1.Move(o.GetMove())}
		if r := o.GetRoute(); r != nil {
			out.Origin.Route = &handoffv1.RouteChoice{Name: r.GetName(), Reason: r.GetReason(), Priority: handoffv1.RoutePriority(r.GetPriority())}
		}
	}
	return out, nil
}

func cloneStrings(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}

// artifactV2 and artifactV1 carry an artifact reference across versions: its fields are the
// same in both.
func artifactV2(a *handoffv1.Artifact) *handoffv2.Artifact {
	return &handoffv2.Artifact{
		Type: a.GetType(), SchemaVersion: a.GetSchemaVersion(), Uri: a.GetUri(),
		MediaType: a.GetMediaType(), Sha256: a.GetSha256(), ProducedBy: a.GetProducedBy(),
	}
}

func artifactV1(a *handoffv2.Artifact) *handoffv1.Artifact {
	return &handoffv1.Artifact{
		Type: a.GetType(), SchemaVersion: a.GetSchemaVersion(), Uri: a.GetUri(),
		MediaType: a.GetMediaType(), Sha256: a.GetSha256(), ProducedBy: a.GetProducedBy(),
	}
}
