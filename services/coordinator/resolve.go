package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	hoptrace "github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/traceparent"
)

// DefaultClaimTTL is how long an operator's claim of an escalation lasts.
const DefaultClaimTTL = 15 * time.Minute

// maxOperatorReturns is the contract's cap on HandoffPackage.operator_returns.
const maxOperatorReturns = 1000

// ListEscalations lists ESCALATED runs, newest first. Who may call it (an operator) is the
// identity policy's rule, checked before any handler runs (internal/interceptor/identity).
func (s *Server) ListEscalations(ctx context.Context, req *handoffv1.ListEscalationsRequest) (*handoffv1.ListEscalationsResponse, error) {
	resp, err := s.ListJobs(ctx, &handoffv1.ListJobsRequest{State: handoffv1.JobState_JOB_STATE_ESCALATED, PageSize: req.GetPageSize(), PageToken: req.GetPageToken()})
	if err != nil {
		return nil, err
	}
	return &handoffv1.ListEscalationsResponse{Jobs: resp.GetJobs(), NextPageToken: resp.GetNextPageToken()}, nil
}

// Stages returns the stage names of a loaded pipeline, in order.
func (s *Server) Stages(pipelineName string) []string {
	p, ok := s.opts.Pipelines[pipelineName]
	if !ok {
		return nil
	}
	out := make([]string, 0, len(p.Stages))
	for _, st := range p.Stages {
		out = append(out, st.Name)
	}
	return out
}

// MaxGrant is the most a person may give a run of pipelineName in one return.
func (s *Server) MaxGrant(pipelineName string) pipeline.Grant {
	if p, ok := s.opts.Pipelines[pipelineName]; ok {
		return p.Escalation.MaxGrant
	}
	return pipeline.Grant{}
}

// writebackStage is the pipeline's first writeback stage.
func writebackStage(p *pipeline.Pipeline) *pipeline.Stage {
	for i := range p.Stages {
		if p.Stages[i].IsWriteback() {
			return &p.Stages[i]
		}
	}
	return nil
}

// Proposed returns the run's proposed artifact: the latest one of the schema its writeback
// stage writes (else the latest artifact), and its bytes when an artifact store is set.
func (s *Server) Proposed(ctx context.Context, job *handoffv1.Job) (*handoffv1.Artifact, []byte, error) {
	var art *handoffv1.Artifact
	if p, ok := s.opts.Pipelines[job.GetPipeline()]; ok {
		if wb := writebackStage(p); wb != nil {
			art = latestArtifact(job.GetArtifacts(), wb.Input)
		}
	}
	if art == nil {
		art = latestArtifact(job.GetArtifacts(), "")
	}
	if art == nil || s.opts.Artifacts == nil {
		return art, nil, nil
	}
	data, err := s.opts.Artifacts.Get(ctx, art.GetUri())
	return art, data, err
}

// Approvable says whether an approve of job could write anything: the pipeline has a
// writeback stage and the run holds an artifact of the version that stage reads. When not,
// the error (FailedPrecondition) names what is missing, and the page offers no Approve.
func (s *Server) Approvable(job *handoffv1.Job) error {
	p, ok := s.opts.Pipelines[job.GetPipeline()]
	if !ok {
		return status.Errorf(codes.FailedPrecondition, "pipeline %q of run %s is not loaded", job.GetPipeline(), job.GetRunId())
	}
	return approvable(p, job)
}

func approvable(p *pipeline.Pipeline, job *handoffv1.Job) error {
	wb := writebackStage(p)
	if wb == nil {
		return status.Errorf(codes.FailedPrecondition, "pipeline %s has no writeback stage to approve into", p.Name)
	}
	if latestArtifact(job.GetArtifacts(), wb.Input) == nil {
		return status.Errorf(codes.FailedPrecondition, "run %s has no %s artifact (the input of writeback stage %s): there is nothing to approve; return it to a stage, or fail it",
			job.GetRunId(), wb.Input, wb.Name)
	}
	return nil
}

// grantAllowed checks a return's grant g against the pipeline's escalation.max_grant, and
// that a return from an escalation caused by what ran out (hops, revisions, money) gives
// some of it: without, the run would escalate again at once.
func grantAllowed(p *pipeline.Pipeline, job *handoffv1.Job, g *handoffv1.Grant) error {
	m := p.Escalation.MaxGrant
	for _, c := range []struct {
		name      string
		got, most int64
	}{{"hops", int64(g.GetHops()), int64(m.Hops)}, {"revisions", int64(g.GetRevisions()), int64(m.Revisions)}, {"usd_micros", g.GetUsdMicros(), m.USDMicros}} {
		if c.got > c.most {
			return status.Errorf(codes.InvalidArgument, "grant.%s is %d: pipeline %s lets a person give at most %d (escalation.max_grant.%s)", c.name, c.got, p.Name, c.most, c.name)
		}
	}
	var lack, field string
	var most int64
	switch job.GetEscalation().GetCause() {
	case handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP:
		lack, field, most = "no hops left", "hops", int64(m.Hops)
		if g.GetHops() > 0 {
			return nil
		}
	case handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED:
		lack, field, most = "no revisions left", "revisions", int64(m.Revisions)
		if g.GetRevisions() > 0 {
			return nil
		}
	case handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY:
		lack, field, most = "no money left", "usd_micros", m.USDMicros
		if g.GetUsdMicros() > 0 {
			return nil
		}
	default:
		return nil
	}
	if most == 0 {
		return status.Errorf(codes.FailedPrecondition, "run %s escalated %s with %s, so a return would escalate again at once, and pipeline %s lets no grant of %s (escalation.max_grant.%s): approve, fail or reject it",
			job.GetRunId(), strings.TrimPrefix(job.GetEscalation().GetCause().String(), "ESCALATION_CAUSE_"), lack, p.Name, field, field)
	}
	return status.Errorf(codes.FailedPrecondition, "run %s escalated %s with %s, so a return would escalate again at once: grant %s with it (grant.%s, up to %d)",
		job.GetRunId(), strings.TrimPrefix(job.GetEscalation().GetCause().String(), "ESCALATION_CAUSE_"), lack, field, field, most)
}

// hold holds run runID for a person's call as a driver does: reserved in this process,
// leased across replicas, and fenced: the returned context carries the run's new epoch
// (store.Fences), taken with the lease and before the call reads the run, so the call's
// saves are fenced as a driver's are and a stalled earlier holder's save is refused after
// it. A driver that just escalated the run may still be releasing it, so it waits a
// little. release is safe to call more than once.
func (s *Server) hold(ctx context.Context, runID string) (context.Context, func(), error) {
	if s.stopped() {
		return nil, nil, status.Error(codes.Unavailable, "coordinator is shutting down")
	}
	// A nested run is its parent driver's: fenced by that driver's epoch (subjob.go), which
	// a fence of the decision's own would take from it, and driven by it only, so a run a
	// decision saved RUNNING would wait for a driver forever. Its escalation escalated the
	// parent, where it is decided. Its parent is set when it is created and never changes,
	// so this read needs no fence.
	if j, err := s.opts.Store.GetRun(ctx, runID); err != nil {
		return nil, nil, storeErr(err, runID)
	} else if p := j.GetParentRunId(); p != "" {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "run %s is the nested run of a sub-job of run %s: its parent's driver drives it, and its escalation is decided on run %s", runID, p, p)
	}
	// Hold the run like a driver does: reserved in this process, leased across replicas.
	// A driver that just escalated the run may still be releasing it: wait a little.
	for wait := time.Now().Add(3 * time.Second); !s.reserve(runID); {
		if time.Now().After(wait) || ctx.Err() != nil {
			return nil, nil, status.Errorf(codes.Aborted, "run %s is busy (being driven or resolved); retry", runID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	l := &lease{s: s, name: leaseName(runID)}
	held, released := false, false
	stopKeep := func() {}
	release := func() {
		if released {
			return // the run may be a driver's by now: its reservation is not ours to drop
		}
		released = true
		stopKeep()
		if held {
			if err := l.giveBack(ctx); err != nil {
				s.log.Warn("release run lease (it expires by itself)", "run_id", runID, "err", err)
			}
			held = false
		}
		s.unreserve(runID)
	}
	ok, err := l.acquire(ctx)
	if err != nil {
		release()
		return nil, nil, status.Errorf(codes.Unavailable, "store: %v", err)
	}
	if !ok {
		release()
		return nil, nil, status.Errorf(codes.Aborted, "run %s is held by another replica; retry", runID)
	}
	held = true
	fctx, cancel := context.WithTimeout(ctx, leaseTimeout)
	epoch, err := s.opts.Store.FenceRun(fctx, runID)
	cancel()
	if err != nil {
		release()
		return nil, nil, status.Errorf(codes.Unavailable, "store: fence run %s: %v", runID, err)
	}
	// Kept as a driver keeps its lease, until release: a decision can outlast one lease
	// TTL (an edit stored, a PII scan, the inline writeback hop), and a lease that lapsed
	// under it would be taken over and fenced past the decision's epoch, refusing its save.
	// A renewal that finds the lease taken only stops renewing: the decision's fenced save
	// then says so.
	kctx, lose := context.WithCancelCause(context.WithoutCancel(ctx))
	kept := make(chan struct{})
	go func() { defer close(kept); l.keep(kctx, lose, runID) }()
	stopKeep = func() { lose(nil); <-kept }
	return withEpoch(ctx, epoch), release, nil
}

// liveClaim is job's claim when it holds the run's current escalation and has not expired.
func liveClaim(job *handoffv1.Job, now time.Time) *handoffv1.Claim {
	c := job.GetClaim()
	if c == nil || job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || c.GetEscalation() != escalationNumber(job.GetEscalation()) || !c.GetExpiresAt().AsTime().After(now) {
		return nil
	}
	return c
}

// ClaimEscalation makes the caller the one owner of the run's current escalation until
// ClaimTTL from now (renewing its own claim), or gives its claim up (release). A claim
// another operator holds is refused naming them and when it ends.
func (s *Server) ClaimEscalation(ctx context.Context, req *handoffv1.ClaimEscalationRequest) (*handoffv1.ClaimEscalationResponse, error) {
	if err := s.opts.Validator.Validate(req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "invalid request: %v", err)
	}
	who := account(ctx)
	if who == "" {
		return nil, status.Error(codes.Unauthenticated, "a claim needs an operator's identity")
	}
	runID := req.GetRunId()
	ctx, release, err := s.hold(ctx, runID)
	if err != nil {
		return nil, err
	}
	defer release()
	job, err := s.opts.Store.GetRun(ctx, runID)
	if err != nil {
		return nil, storeErr(err, runID)
	}
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		return nil, status.Errorf(codes.FailedPrecondition, "run %s is %s, not ESCALATED: there is nothing to claim", runID, strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"))
	}
	n := escalationNumber(job.GetEscalation())
	if req.GetEscalation() != n {
		return nil, status.Errorf(codes.FailedPrecondition, "run %s is at escalation %d; this claim names escalation %d: reload", runID, n, req.GetEscalation())
	}
	now := s.opts.Now()
	c := liveClaim(job, now)
	if c != nil && c.GetAccount() != who {
		return nil, status.Errorf(codes.FailedPrecondition, "run %s: escalation %d is claimed by %s until %s", runID, n, c.GetAccount(), c.GetExpiresAt().AsTime().UTC().Format(time.RFC3339))
	}
	if req.GetRelease() {
		job.Claim = nil
	} else {
		at := timestamppb.New(now)
		if c != nil {
			at = c.GetAt() // a renewal keeps when the claim began
		}
		job.Claim = &handoffv1.Claim{Account: who, Escalation: n, At: at, ExpiresAt: timestamppb.New(now.Add(s.opts.ClaimTTL))}
	}
	if err := s.save(ctx, job); err != nil {
		return nil, saveErr(err)
	}
	s.log.Info("escalation claim", "run_id", runID, "escalation", n, "account", who, "release", req.GetRelease())
	return &handoffv1.ClaimEscalationResponse{Claim: job.GetClaim()}, nil
}

// ResolveEscalation applies a person's decision to an ESCALATED run. Approving a run that an
// earlier approve completed sends the same write again (same idempotency key): the writeback
// answers with the first receipt and writes nothing (duplicate=true).
//
// The decision names the escalation it answers (req.escalation): one taken for an escalation
// the run has since left is refused, so a stale page cannot decide the run's next one.
func (s *Server) ResolveEscalation(ctx context.Context, req *handoffv1.ResolveEscalationRequest) (*handoffv1.ResolveEscalationResponse, error) {
	// In-process callers (the web page) skip the interceptor chain: validate here too.
	if err := s.opts.Validator.Validate(req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "invalid request: %v", err)
	}
	runID := req.GetRunId()
	ctx, release, err := s.hold(ctx, runID)
	if err != nil {
		return nil, err
	}
	defer release()

	job, err := s.opts.Store.GetRun(ctx, runID)
	if err != nil {
		return nil, storeErr(err, runID)
	}
	p, ok := s.opts.Pipelines[job.GetPipeline()]
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "pipeline %q of run %s is not loaded", job.GetPipeline(), runID)
	}
	if req, err = s.piiResolve(ctx, p, job.GetJobId(), req); err != nil {
		return nil, err
	}
	if _, isApprove := req.GetAction().(*handoffv1.ResolveEscalationRequest_Approve); isApprove &&
		job.GetState() == handoffv1.JobState_JOB_STATE_COMPLETED &&
		job.GetResolution().GetAction() == handoffv1.ResolutionAction_RESOLUTION_ACTION_APPROVE {
		if n := escalationNumber(job.GetResolution().GetEscalation()); req.GetEscalation() != n {
			return nil, status.Errorf(codes.FailedPrecondition, "run %s: escalation %d was approved; this decision names escalation %d", runID, n, req.GetEscalation())
		}
		return s.reapprove(ctx, job, p)
	}
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		return nil, status.Errorf(codes.FailedPrecondition, "run %s is %s, not ESCALATED", runID, strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"))
	}
	if n := escalationNumber(job.GetEscalation()); req.GetEscalation() != n {
		return nil, status.Errorf(codes.FailedPrecondition, "run %s is at escalation %d (%s); this decision was made for escalation %d: reload and decide again",
			runID, n, strings.TrimPrefix(job.GetEscalation().GetCause().String(), "ESCALATION_CAUSE_"), req.GetEscalation())
	}

	res := &handoffv1.Resolution{Operator: req.GetOperator(), Comment: req.GetComment(), Escalation: job.GetEscalation(), At: timestamppb.New(s.opts.Now()), Account: account(ctx)}
	if c := liveClaim(job, s.opts.Now()); c != nil && c.GetAccount() != res.GetAccount() {
		if !req.GetOverride() {
			return nil, status.Errorf(codes.FailedPrecondition, "run %s: escalation %d is claimed by %s until %s: only the holder decides it (override to decide anyway; it is recorded)",
				runID, c.GetEscalation(), c.GetAccount(), c.GetExpiresAt().AsTime().UTC().Format(time.RFC3339))
		}
		res.Overrode = c.GetAccount()
	}
	// The decision ends the escalation, and with it its claim.
	job.Claim = nil
	var edit *string
	var target *pipeline.Stage
	switch a := req.GetAction().(type) {
	case *handoffv1.ResolveEscalationRequest_Approve:
		res.Action = handoffv1.ResolutionAction_RESOLUTION_ACTION_APPROVE
		edit = a.Approve.ArtifactText
		// Approve writes the writeback stage's input; without one it could only re-escalate
		// (WRITE_REFUSED) after recording a decision that did not happen: refuse it first.
		if err := approvable(p, job); err != nil {
			return nil, err
		}
		target = writebackStage(p)
	case *handoffv1.ResolveEscalationRequest_ReturnToStage:
		res.Action = handoffv1.ResolutionAction_RESOLUTION_ACTION_RETURN_TO_STAGE
		edit = a.ReturnToStage.ArtifactText
		st, _, ok := p.Stage(a.ReturnToStage.GetStage())
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "stage %q is not in pipeline %s (stages: %s)", a.ReturnToStage.GetStage(), p.Name, strings.Join(s.Stages(p.Name), ", "))
		}
		target, res.Stage = st, st.Name
		if err := grantAllowed(p, job, a.ReturnToStage.GetGrant()); err != nil {
			return nil, err
		}
		if g := a.ReturnToStage.GetGrant(); g.GetHops() > 0 || g.GetRevisions() > 0 || g.GetUsdMicros() > 0 {
			res.Grant = g
		}
	case *handoffv1.ResolveEscalationRequest_Fail:
		res.Action, res.Reason = handoffv1.ResolutionAction_RESOLUTION_ACTION_FAIL, a.Fail.GetReason()
	case *handoffv1.ResolveEscalationRequest_RejectMalformed:
		res.Action, res.Reason = handoffv1.ResolutionAction_RESOLUTION_ACTION_REJECT_MALFORMED, a.RejectMalformed.GetReason()
	default:
		return nil, status.Error(codes.InvalidArgument, "invalid request: action is required")
	}

	// Rounds count judge verdicts only. A stage re-run after a return is a new completion
	// (never a DUPLICATE) because the return is counted in operator_returns, which the agent
	// runner keys completions (and artifacts) by. round only names an edited artifact's
	// version, one past the judge's last round.
	round := job.GetEvaluator().GetRounds() + 1
	returns := job.GetOperatorReturns()
	if res.Action == handoffv1.ResolutionAction_RESOLUTION_ACTION_RETURN_TO_STAGE {
		if returns >= maxOperatorReturns {
			// The contract caps the count (operator_returns <= 1000): past it every package
			// of the run would be rejected as malformed.
			return nil, status.Errorf(codes.FailedPrecondition, "run %s was sent back to a stage %d times already, the most a run can be; approve, fail or reject it", runID, returns)
		}
		returns++
	}
	if edit != nil {
		if s.opts.Artifacts == nil {
			return nil, status.Error(codes.FailedPrecondition, "this coordinator has no artifact store: edits are not possible")
		}
		prop, _, err := s.Proposed(ctx, job)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "read the proposed artifact: %v", err)
		}
		var typ, version, mt string
		switch {
		case prop != nil:
			typ, version, mt = prop.GetType(), prop.GetSchemaVersion(), prop.GetMediaType()
		case res.Action == handoffv1.ResolutionAction_RESOLUTION_ACTION_RETURN_TO_STAGE && target.Input != "":
			// Nothing to edit (a job submitted without its input): the text is the input of
			// the stage returned to, of the version that stage reads.
			typ, version = typeOfVersion(target.Input), target.Input
			if json.Valid([]byte(*edit)) {
				mt = "application/json"
			}
		default:
			return nil, status.Errorf(codes.FailedPrecondition, "run %s has no artifact to edit", runID)
		}
		if mt == "" {
			mt = "text/plain"
		}
		a, err := s.opts.Artifacts.Put(ctx, artifact.Ref{JobID: job.GetJobId(), Stage: "operator", Round: round, Returns: returns, Visit: escalationNumber(job.GetEscalation()), Type: typ, SchemaVersion: version, MediaType: mt}, []byte(*edit))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "store the edited artifact: %v", err)
		}
		if err := s.opts.Validator.Validate(a); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "edited artifact: %v", err)
		}
		job.Artifacts = append(job.Artifacts, a)
		res.EditedArtifact = a
	}
	// Whatever this resolution saves carries the store's wallet, not the run's copy: an
	// earlier approve whose save failed may have paid its writeback hop since the run was
	// saved, and a run saved with the older copy would make its next driver take that debit
	// for its own repeated step's (stepWallet) and not pay a new hop. saved keeps the run's
	// copy for the approve below.
	saved := job.GetWallet()
	w, err := s.opts.Store.Wallet(ctx, runID)
	if g := res.GetGrant(); g != nil && err == nil {
		// The grant, keyed by the escalation it answers: a decision retried after a save
		// that failed finds it given already and adds nothing again.
		w, err = s.opts.Store.GrantWallet(ctx, runID, fmt.Sprintf("%s/escalation/%d", runID, escalationNumber(job.GetEscalation())),
			store.Grant{Hops: g.GetHops(), Revisions: g.GetRevisions(), USDMicros: g.GetUsdMicros()})
		if errors.Is(err, store.ErrGrantTooLarge) {
			return nil, status.Errorf(codes.InvalidArgument, "grant: %v (a wallet holds at most %d hops and %d revisions)", err, store.MaxHops, store.MaxRevisions)
		}
	}
	switch {
	case err == nil:
		s.setWallet(job, w)
	case errors.Is(err, store.ErrNotFound) && res.GetGrant() != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "run %s has no wallet to grant to", runID)
	case !errors.Is(err, store.ErrNotFound):
		return nil, status.Errorf(codes.Unavailable, "store: %v", err)
	}
	job.Resolution = res
	resp := &handoffv1.ResolveEscalationResponse{Resolution: res}

	switch res.Action {
	case handoffv1.ResolutionAction_RESOLUTION_ACTION_FAIL, handoffv1.ResolutionAction_RESOLUTION_ACTION_REJECT_MALFORMED:
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_RESOLVED, Stage: job.GetStage(), Resolution: res})
		what := "failed"
		if res.Action == handoffv1.ResolutionAction_RESOLUTION_ACTION_REJECT_MALFORMED {
			what = "rejected as malformed"
		}
		if err := s.finish(ctx, job, handoffv1.JobState_JOB_STATE_FAILED, job.GetEscalation(), fmt.Sprintf("%s by %s: %s", what, res.GetOperator(), res.GetReason()), nil); err != nil {
			return nil, saveErr(err)
		}
	case handoffv1.ResolutionAction_RESOLUTION_ACTION_RETURN_TO_STAGE:
		if c := req.GetComment(); c != "" {
			job.NextHint = truncate("operator: "+c, 1000)
		}
		job.OperatorReturns = returns
		moved := s.operatorMove(job, p, target)
		job.State = handoffv1.JobState_JOB_STATE_RUNNING
		job.Escalation = nil
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_RESOLVED, Stage: target.Name, Resolution: res, Evaluator: job.GetEvaluator(), Transfer: moved})
		if err := s.save(ctx, job); err != nil {
			return nil, saveErr(err)
		}
	case handoffv1.ResolutionAction_RESOLUTION_ACTION_APPROVE:
		// A human PASS: rounds still count the judge's verdicts (none is added for the
		// person), and the judge's "revise" hint no longer stands.
		job.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: job.GetEvaluator().GetRounds()}
		job.NextHint = ""
		// A person's PASS is a PASS given: recorded like a judge's.
		if err := s.opts.Store.RecordVerdict(ctx, walletOf(job), handoffv1.Verdict_VERDICT_PASS); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, status.Errorf(codes.Unavailable, "record verdict: %v", err)
		}
		moved := s.operatorMove(job, p, target)
		job.State = handoffv1.JobState_JOB_STATE_RUNNING
		job.Escalation = nil
		// The decision takes effect when the run is saved RUNNING at the writeback stage with
		// the human PASS, together with its RESOLVED event; a crash after this save leaves a
		// run the takeover scan drives to the same write.
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_RESOLVED, Stage: target.Name, Resolution: res, Evaluator: job.GetEvaluator(), Transfer: moved})
		if err := s.save(ctx, job); err != nil {
			return nil, saveErr(err)
		}
		// The writeback hop, inline: the same code the run loop uses (a judge's PASS gate,
		// the job_id:stage:artifact_type key), without the wallet checks a person overrides.
		// An earlier approve whose save failed may have paid this hop already: the store's
		// wallet below the run's saved copy says so.
		if err := s.writebackHop(ctx, job, p, target, stepWallet{saved: saved}); err != nil {
			return nil, saveErr(err)
		}
		resp.Receipt = job.GetReceipt()
	}
	release()
	if job.GetState() == handoffv1.JobState_JOB_STATE_RUNNING {
		if _, err := s.drive(context.WithoutCancel(ctx), runID, nil); err != nil {
			s.log.Warn("could not take the resolved run's lease; the takeover scan will drive it", "run_id", runID, "err", err)
		}
	}
	if cur, err := s.opts.Store.GetRun(ctx, runID); err == nil {
		job = cur
	}
	resp.Job = job
	if r := job.GetReceipt(); resp.Receipt == nil && r != nil && res.Action == handoffv1.ResolutionAction_RESOLUTION_ACTION_APPROVE {
		resp.Receipt = r
	}
	s.log.Info("escalation resolved", "run_id", runID, "job_id", job.GetJobId(), "action", res.GetAction().String(), "operator", res.GetOperator(), "account", res.GetAccount(), "state", job.GetState().String())
	return resp, nil
}

// operatorMove moves the run to stage target on a person's word and records the move: it
// starts a new round (the decision counts as one), so the stage runs as a new completion.
func (s *Server) operatorMove(job *handoffv1.Job, p *pipeline.Pipeline, target *pipeline.Stage) *handoffv1.Transfer {
	t := transfer(p, job, job.GetStage(), target.Name, handoffv1.Move_MOVE_OPERATOR, nil)
	job.Transfers = append(job.Transfers, t)
	job.Stage = target.Name
	return t
}

// writebackHop runs stage st (a writeback) for the run under a send span, as step does,
// but without the wallet checks a person overrides (next's gate still holds).
func (s *Server) writebackHop(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, w stepWallet) error {
	t := next(p, job, w, outcome{Override: true})
	if t.Action != actSend {
		return s.apply(ctx, job, p, w, t, nil)
	}
	hctx, tp, end := s.hopSpan(ctx, job, st)
	defer end()
	return s.writeback(hctx, job, p, st, s.buildPackage(job, st, tp), w, t.Artifact)
}

func (s *Server) hopSpan(ctx context.Context, job *handoffv1.Job, st *pipeline.Stage) (context.Context, string, func()) {
	parent, _ := hoptrace.Parse(ctx, job.GetTraceparent(), "")
	hctx, span := s.tracer.Start(parent, "handoff.send "+st.Name, oteltrace.WithSpanKind(oteltrace.SpanKindProducer),
		oteltrace.WithAttributes(attribute.String("handoff.job_id", job.GetJobId()), attribute.String("handoff.stage", st.Name), attribute.String("handoff.run_id", job.GetRunId())))
	tp := hoptrace.Format(hctx)
	if tp == "" {
		tp = traceparent.Child(job.GetTraceparent())
	}
	return hctx, tp, func() { span.End() }
}

// reapprove sends an approved run's write again: the writeback's idempotency answers with
// the first receipt and writes nothing. The run is not changed.
func (s *Server) reapprove(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline) (*handoffv1.ResolveEscalationResponse, error) {
	st := writebackStage(p)
	if st == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "pipeline %s has no writeback stage", p.Name)
	}
	art := latestArtifact(job.GetArtifacts(), st.Input)
	if art == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "run %s has no artifact to write", job.GetRunId())
	}
	hctx, tp, end := s.hopSpan(ctx, job, st)
	defer end()
	pkg := s.buildPackage(job, st, tp)
	var wr *handoffv1.WriteResponse
	err := s.retry(hctx, job, st.Name, func(ctx context.Context) error {
		var err error
		wr, err = s.opts.Writeback.Write(ctx, &handoffv1.WriteRequest{Package: pkg, Artifact: art, Target: st.Writer.Target})
		return err
	})
	if err != nil {
		return nil, status.Errorf(status.Code(err), "writeback: %s", status.Convert(err).Message())
	}
	return &handoffv1.ResolveEscalationResponse{Job: job, Receipt: wr.GetReceipt(), Duplicate: wr.GetDuplicate(), Resolution: job.GetResolution()}, nil
}

// typeOfVersion is the artifact type a schema version is of: "raw_ticket.v1" is of
// raw_ticket (lint holds every version to <type>.v<N>).
func typeOfVersion(v string) string {
	if i := strings.LastIndex(v, ".v"); i > 0 {
		return v[:i]
	}
	return v
}

// truncate cuts s to at most n bytes on a rune boundary, so the result stays UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// account names the verified caller of ctx for the record of a decision.
func account(ctx context.Context) string {
	id, ok := identity.FromContext(ctx)
	switch {
	case !ok:
		return ""
	case id.Name != "":
		return id.Name
	default:
		return id.String()
	}
}

// escalationNumber is esc's number; an escalation stored before numbers existed is 1.
func escalationNumber(esc *handoffv1.Escalation) uint32 {
	return max(esc.GetNumber(), 1)
}

// saveErr is the answer to a decision whose save (or inline writeback hop) failed: Aborted
// when the run was taken over under a newer epoch while the decision held it (its save was
// fenced, nothing of it written: reload and decide again), else Unavailable.
func saveErr(err error) error {
	if errors.Is(err, store.ErrFenced) {
		return status.Errorf(codes.Aborted, "%v; reload the run", err)
	}
	return status.Errorf(codes.Unavailable, "%v", err)
}
