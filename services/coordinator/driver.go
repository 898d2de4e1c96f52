package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	hoptrace "github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/traceparent"
)

// maxCarried caps the lists a package carries (the contract's size caps). The run keeps
// everything; a package carries the most recent entries.
const maxCarried = 64

// run advances the run hop by hop until it ends, while this replica holds the run's lease
// (lease.go): the lease is renewed before a hop unless it was renewed in the last LeaseTTL/3,
// and the driver stops before its next hop when it was lost, or when Close started. The run is saved after every hop, so whoever
// drives it next resumes at the last completed hop. When the store fails, the run waits and
// tries again: it neither skips a hop nor ends in a state it did not reach.
func (s *Server) run(ctx context.Context, runID string, l *lease, start *handoffv1.Job) error {
	backoff := 100 * time.Millisecond
	// The run as this driver last saved it. Only this driver writes the run while it holds
	// the lease, and the wallet changes only through its own hops, whose answers it mirrors:
	// so after a step that saved, the next one starts from memory instead of reading the run
	// and its wallet again. After any error it reads both from the store.
	job := start
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if s.stopped() {
			return errStopping
		}
		held, err := l.renew(ctx)
		if err == nil && !held {
			return errLeaseLost
		}
		if err == nil {
			job, err = s.advance(ctx, runID, job)
		}
		if err == errDone {
			return nil
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		job = nil
		s.dropUnsaved(runID, err.Error())
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		s.log.Warn("run waits for the store", "run_id", runID, "retry_in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-s.stopping:
			return errStopping
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

var errDone = errors.New("run ended")

// advance makes one hop of the run (errDone when the run has ended) and returns the run as
// that hop saved it. job is the run as the previous hop saved it, or nil to load it.
func (s *Server) advance(ctx context.Context, runID string, job *handoffv1.Job) (*handoffv1.Job, error) {
	var saved *handoffv1.Budget
	if job == nil {
		var err error
		if job, err = s.opts.Store.GetRun(ctx, runID); err != nil {
			return nil, err
		}
		if terminal(job.GetState()) {
			return nil, errDone
		}
		// The wallet lives in the store under the run id, where every receiver that shares
		// the store debits it, for the run's job only. Opening is idempotent: it creates the
		// wallet on the first hop (or after a crash between submit and here) and otherwise
		// returns what is left; a wallet from before wallets recorded their job becomes this
		// job's here, before any package names it.
		w, err := s.opts.Store.OpenWallet(ctx, job.GetRunId(), job.GetJobId(), job.GetWallet())
		if err != nil {
			return nil, fmt.Errorf("open wallet: %w", err)
		}
		saved = job.GetWallet()
		s.setWallet(job, w)
	}
	if terminal(job.GetState()) {
		return nil, errDone
	}
	if err := s.step(ctx, job, saved); err != nil {
		return nil, err
	}
	return job, nil
}

// setWallet mirrors the store's wallet into the run, tagged with its id.
func (s *Server) setWallet(job *handoffv1.Job, w *handoffv1.Budget) {
	w = proto.Clone(w).(*handoffv1.Budget)
	w.WalletId = job.GetRunId()
	job.Wallet = w
}

// debit takes d from the run's wallet in the store and mirrors the result into the run.
func (s *Server) debit(ctx context.Context, job *handoffv1.Job, d store.Debit) error {
	w, err := s.opts.Store.Debit(ctx, job.GetRunId(), d)
	if err != nil {
		return err
	}
	s.setWallet(job, w)
	return nil
}

// step makes one hop of a RUNNING run and saves the outcome. saved is the wallet as the run
// last saved it when the run was just loaded (nil when job is the run the previous step
// saved): every debit is mirrored into the run when it is saved, so a wallet now below
// saved was debited by a step whose save failed (or whose coordinator stopped), and this
// step repeats it. What that step paid is not charged again: the runner replays its hop
// free of charge, and the rail skips its own debits already taken (aheadOf).
func (s *Server) step(ctx context.Context, job *handoffv1.Job, saved *handoffv1.Budget) error {
	p, ok := s.opts.Pipelines[job.GetPipeline()]
	if !ok {
		return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_FAILED, nil, fmt.Sprintf("pipeline %q is no longer loaded", job.GetPipeline()))
	}
	st, _, ok := p.Stage(job.GetStage())
	if !ok {
		return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_FAILED, nil, fmt.Sprintf("stage %q is not in pipeline %s", job.GetStage(), p.Name))
	}
	// The rail checks the wallet before it sends anything: an empty wallet or the hop cap
	// ends the run here, gracefully, instead of in the middle of a stage. Not when the
	// repeated step emptied it: its hop is a replay that costs nothing again (a hop the
	// runner would charge, it refuses with REJECTED_BUDGET before any agent runs).
	hopPaid, usdPaid, _ := aheadOf(saved, job.GetWallet())
	switch {
	case hopPaid || usdPaid:
	case job.GetWallet().GetHopsRemaining() == 0:
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP, fmt.Sprintf("hop cap reached after %d hops", job.GetHops()), nil)
	case job.GetWallet().GetUsdRemainingMicros() == 0:
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY, "the job's wallet is empty", nil)
	}
	// The hop's send span: a child of the job's trace, and the parent of the receiver's
	// ack span through the package's traceparent (and of the gRPC client span).
	parent, _ := hoptrace.Parse(ctx, job.GetTraceparent(), "")
	hctx, span := s.tracer.Start(parent, "handoff.send "+st.Name, oteltrace.WithSpanKind(oteltrace.SpanKindProducer),
		oteltrace.WithAttributes(attribute.String("handoff.job_id", job.GetJobId()), attribute.String("handoff.stage", st.Name), attribute.String("handoff.run_id", job.GetRunId())))
	defer span.End()
	tp := hoptrace.Format(hctx)
	if tp == "" {
		tp = traceparent.Child(job.GetTraceparent())
	}
	pkg := s.buildPackage(job, st, tp)
	// Hop calls run under the span (so gRPC metadata carries it); saving state does not
	// depend on it.
	if st.IsWriteback() {
		return s.writeback(hctx, job, p, st, pkg, saved)
	}
	return s.agentHop(hctx, job, p, st, pkg, saved)
}

// payHop is the rail paying a hop itself (a receiver that does not share its store, the
// writeback): one hop off the wallet, never below zero, and not again when this step is a
// repeat whose hop was paid before its save failed (saved, see step).
func (s *Server) payHop(ctx context.Context, job *handoffv1.Job, saved *handoffv1.Budget) error {
	if hopPaid, _, _ := aheadOf(saved, job.GetWallet()); hopPaid {
		return nil
	}
	if err := s.debit(ctx, job, store.Debit{Hops: 1}); err != nil && !errors.Is(err, store.ErrWalletEmpty) {
		return err
	}
	return nil
}

// aheadOf says which parts of wallet cur are below saved (see step): hops, money and
// revisions already taken by a step being repeated. All false when saved is nil.
func aheadOf(saved, cur *handoffv1.Budget) (hops, usd, revisions bool) {
	if saved == nil {
		return false, false, false
	}
	return cur.GetHopsRemaining() < saved.GetHopsRemaining(),
		cur.GetUsdRemainingMicros() < saved.GetUsdRemainingMicros(),
		cur.GetRevisionsRemaining() < saved.GetRevisionsRemaining()
}

// buildPackage makes the package for stage st from the run's durable state alone. Goal and
// constraints come from intake and nothing else can change them.
func (s *Server) buildPackage(job *handoffv1.Job, st *pipeline.Stage, tp string) *handoffv1.HandoffPackage {
	pkg := &handoffv1.HandoffPackage{
		Schema:        contract.V1,
		JobId:         job.GetJobId(),
		Stage:         st.Name,
		Goal:          job.GetGoal(),
		Constraints:   job.GetConstraints(),
		Artifacts:     last(job.GetArtifacts()),
		OpenQuestions: last(job.GetOpenQuestions()),
		ToolsTried:    last(job.GetToolsTried()),
		Evaluator:     job.GetEvaluator(),
		Budget:        job.GetWallet(),
		MemoryRefs:    job.GetMemoryRefs(),
		Trace:         &handoffv1.Trace{Traceparent: tp},
		NextHint:      job.GetNextHint(),
		// A stage a person sent the run back to is a new completion for the runner.
		OperatorReturns: job.GetOperatorReturns(),
	}
	pkg = proto.Clone(pkg).(*handoffv1.HandoffPackage)
	if s.opts.Tamper != nil {
		s.opts.Tamper(pkg)
	}
	return pkg
}

func last[T any](xs []T) []T {
	if len(xs) > maxCarried {
		return xs[len(xs)-maxCarried:]
	}
	return xs
}

// agentHop sends the package to the stage's agent runner and applies the outcome.
func (s *Server) agentHop(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, pkg *handoffv1.HandoffPackage, saved *handoffv1.Budget) error {
	runner := s.runners[st.Runner]
	req := &handoffv1.DeliverRequest{Package: pkg, Agent: st.AgentName(), RequiredTools: st.Tools}
	hop := job.GetHops() + 1
	sent := s.eventAsync(ctx, job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: st.Name, Traceparent: pkg.GetTrace().GetTraceparent(), Hop: hop})

	var ack *handoffv1.Ack
	var result *handoffv1.StageResult
	err := s.retry(ctx, job, st.Name, func(ctx context.Context) error {
		var err error
		ack, result, err = rpc.Deliver(ctx, runner, req)
		return err
	})
	sent()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_FAILED, nil, fmt.Sprintf("stage %s: agent runner unreachable: %v", st.Name, err))
	}

	// The hop happened: one hop off the wallet, whatever the ack says. A receiver that
	// shares the store has already taken it (and says so in ack.wallet); otherwise the rail
	// takes it here, so each hop is debited exactly once.
	job.Hops = hop
	if w := ack.GetWallet(); w != nil {
		s.setWallet(job, w)
	} else if err := s.payHop(ctx, job, saved); err != nil {
		return err
	}
	s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: st.Name, Ack: ack, Traceparent: ack.GetTraceparent(), Hop: hop})

	switch ack.GetStatus() {
	case handoffv1.AckStatus_ACK_STATUS_ACCEPTED:
	case handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
		// The stage already completed for this job: take its first result, do no new work.
		prior := ack.GetPrior()
		result = &handoffv1.StageResult{
			JobId: job.GetJobId(), Stage: st.Name, Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
			Artifacts: prior.GetArtifacts(), Evaluator: prior.GetEvaluator(), NextHint: prior.GetNextHint(),
			Traceparent: ack.GetTraceparent(),
		}
	default:
		return s.escalate(ctx, job, p, causeFor(ack.GetStatus()), fmt.Sprintf("stage %s answered %s", st.Name, ack.GetStatus()), ack.GetReasons())
	}
	if err := s.opts.Validator.Validate(result); err != nil {
		// Fail closed on agent output: nothing of an invalid result enters the run.
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, fmt.Sprintf("stage %s returned an invalid result", st.Name), contract.Reasons(err))
	}

	// One wallet: the stage's spend comes off it, never below zero.
	spent := result.GetSpentUsdMicros()
	job.SpentUsdMicros += spent
	if spent > 0 { // a zero debit changes nothing: the wallet in the run is already current
		if err := s.debit(ctx, job, store.Debit{USDMicros: spent}); err != nil {
			return err
		}
	}
	s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_STAGE_RESULT, Stage: st.Name, Result: result, Traceparent: ack.GetTraceparent(), Hop: hop})

	if result.GetStatus() == handoffv1.StageStatus_STAGE_STATUS_FAILED {
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, fmt.Sprintf("stage %s failed: %s", st.Name, result.GetError()), nil)
	}
	job.Artifacts = append(job.Artifacts, result.GetArtifacts()...)
	job.ToolsTried = append(job.ToolsTried, result.GetToolsTried()...)
	job.OpenQuestions = result.GetOpenQuestions()
	job.NextHint = result.GetNextHint()

	if st.IsJudge() {
		ev := result.GetEvaluator()
		if ev.GetLastVerdict() == handoffv1.Verdict_VERDICT_UNSPECIFIED {
			return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, fmt.Sprintf("judge %s returned no verdict", st.Name), nil)
		}
		job.Evaluator = ev
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_VERDICT, Stage: st.Name, Evaluator: ev, Traceparent: ack.GetTraceparent(), Hop: hop})
		if ev.GetLastVerdict() == handoffv1.Verdict_VERDICT_FAIL {
			// Critique loop: back to the reviser, with the failures in the package, for
			// one revision off the wallet. A repeated step whose revision was taken
			// before its save failed has it already.
			if _, _, taken := aheadOf(saved, job.GetWallet()); !taken {
				err := store.ErrWalletEmpty
				if job.GetWallet().GetRevisionsRemaining() > 0 {
					err = s.debit(ctx, job, store.Debit{Revisions: 1})
				}
				if err != nil && !errors.Is(err, store.ErrWalletEmpty) {
					return err
				}
				if err != nil {
					return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED,
						fmt.Sprintf("judge %s failed the work and no revisions are left", st.Name), failureReasons(ev))
				}
			}
			job.Revisions++
			job.Stage = st.Revise
			return s.save(ctx, job)
		}
	}
	ns, ok := p.Next(st.Name)
	if !ok {
		return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_COMPLETED, nil, "")
	}
	job.Stage = ns.Name
	return s.save(ctx, job)
}

// writeback calls the writeback service, only ever after a judge's PASS.
// saved is as for step.
func (s *Server) writeback(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, pkg *handoffv1.HandoffPackage, saved *handoffv1.Budget) error {
	if job.GetEvaluator().GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS {
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED,
			fmt.Sprintf("writeback %s refused by the rail: last verdict is %s, not PASS", st.Name, job.GetEvaluator().GetLastVerdict()), nil)
	}
	art := latestArtifact(job.GetArtifacts(), st.Input)
	if art == nil {
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED,
			fmt.Sprintf("writeback %s: no artifact with schema version %q to write", st.Name, st.Input), nil)
	}
	hop := job.GetHops() + 1
	sent := s.eventAsync(ctx, job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: st.Name, Traceparent: pkg.GetTrace().GetTraceparent(), Hop: hop})
	req := &handoffv1.WriteRequest{Package: pkg, Artifact: art, Target: st.Writer.Target}
	var resp *handoffv1.WriteResponse
	err := s.retry(ctx, job, st.Name, func(ctx context.Context) error {
		var err error
		resp, err = s.opts.Writeback.Write(ctx, req)
		return err
	})
	sent()
	job.Hops = hop
	// The rail pays the writeback hop itself (nothing else debits between the previous
	// stage's save and this one).
	if derr := s.payHop(ctx, job, saved); derr != nil {
		return derr
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.escalate(ctx, job, p, handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED, fmt.Sprintf("writeback %s: %v", st.Name, status.Convert(err).Message()), nil)
	}
	job.Receipt = resp.GetReceipt()
	// The hop belongs to this run's trace. A duplicate's receipt keeps the trace of the run
	// that made the write, which is what it documents.
	tp := pkg.GetTrace().GetTraceparent()
	ack := &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED, JobId: job.GetJobId(), Stage: st.Name, Traceparent: tp, Schema: contract.V1}
	if resp.GetDuplicate() {
		ack.Status = handoffv1.AckStatus_ACK_STATUS_DUPLICATE
		ack.Prior = &handoffv1.PriorResult{Receipt: resp.GetReceipt(), CompletedAt: resp.GetReceipt().GetWrittenAt()}
	}
	s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: st.Name, Ack: ack, Traceparent: ack.GetTraceparent(), Hop: hop})
	s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_RECEIPT, Stage: st.Name, Receipt: resp.GetReceipt(), Traceparent: tp, Hop: hop})
	if ns, ok := p.Next(st.Name); ok {
		job.Stage = ns.Name
		return s.save(ctx, job)
	}
	return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_COMPLETED, nil, "")
}

func latestArtifact(arts []*handoffv1.Artifact, schemaVersion string) *handoffv1.Artifact {
	for i := len(arts) - 1; i >= 0; i-- {
		if schemaVersion == "" || arts[i].GetSchemaVersion() == schemaVersion {
			return arts[i]
		}
	}
	return nil
}

// retry runs call until it succeeds, fails for good, or gives up: after Retry attempts and
// RetryFor since the first, whichever comes later. Unavailable (peer down), Aborted (the
// same stage or write is in flight elsewhere, or a crashed peer's claim has not lapsed yet),
// ResourceExhausted and DeadlineExceeded are retried with backoff; the rail's keys make a
// repeat harmless. A lost lease or Close cancels ctx and ends the retries at once.
func (s *Server) retry(ctx context.Context, job *handoffv1.Job, stage string, call func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	start := time.Now()
	var err error
	for attempt := 1; ; attempt++ {
		hctx, cancel := context.WithTimeout(ctx, s.opts.HopTimeout)
		err = call(hctx)
		cancel()
		if err == nil {
			return nil
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.DeadlineExceeded:
		default:
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt >= s.opts.Retry && time.Since(start) >= s.opts.RetryFor {
			s.log.Warn("hop failed; giving up", "run_id", job.GetRunId(), "job_id", job.GetJobId(), "stage", stage, "attempts", attempt, "for", time.Since(start).Round(time.Millisecond).String(), "err", err)
			return err
		}
		if attempt&(attempt-1) == 0 { // attempts 1, 2, 4, 8, ...: a long wait logs a few lines, not hundreds
			s.log.Warn("hop failed, retrying", "run_id", job.GetRunId(), "job_id", job.GetJobId(), "stage", stage, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func causeFor(st handoffv1.AckStatus) handoffv1.EscalationCause {
	switch st {
	case handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA:
		return handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA
	case handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE:
		return handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_ROLE
	case handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET:
		return handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_BUDGET
	}
	return handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED
}

func failureReasons(ev *handoffv1.Evaluator) []*handoffv1.Reason {
	out := make([]*handoffv1.Reason, 0, len(ev.GetFailures()))
	for _, f := range ev.GetFailures() {
		out = append(out, &handoffv1.Reason{Field: "evaluator.failures", Rule: f.GetCode(), Message: f.GetDetail()})
	}
	return out
}

// save writes the run together with its waiting events (later). When the write fails, the
// events are dropped with the state they belong to.
func (s *Server) save(ctx context.Context, job *handoffv1.Job) error {
	job.UpdatedAt = timestamppb.New(s.opts.Now())
	evs := s.takePending(job.GetRunId())
	if err := s.opts.Store.PutRun(ctx, job, evs...); err != nil {
		// Neither the state nor its events were written: the step will be repeated from the
		// last saved state and record them again, so they are not kept for a later save.
		s.logDropped(job.GetRunId(), evs, err.Error())
		return fmt.Errorf("save run %s: %w", job.GetRunId(), err)
	}
	if len(evs) > 0 {
		s.published(job.GetRunId(), evs)
	}
	return nil
}

func (s *Server) escalate(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, cause handoffv1.EscalationCause, detail string, reasons []*handoffv1.Reason) error {
	job.Escalations = max(job.GetEscalations(), job.GetResolution().GetEscalation().GetNumber()) + 1
	job.Escalation = &handoffv1.Escalation{
		Cause: cause, Stage: job.GetStage(), Detail: detail, Reasons: reasons,
		Route: p.Escalation.Route, At: timestamppb.New(s.opts.Now()), Number: job.Escalations,
	}
	return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_ESCALATED, job.Escalation, detail)
}

// finish saves the run in a terminal state and records the last event.
func (s *Server) finish(ctx context.Context, job *handoffv1.Job, state handoffv1.JobState, esc *handoffv1.Escalation, detail string) error {
	job.State = state
	if state == handoffv1.JobState_JOB_STATE_FAILED {
		// The rail itself could not go on (a peer unreachable past every retry, a pipeline
		// gone): no escalation cause, but the run still says why it stopped.
		esc = &handoffv1.Escalation{Stage: job.GetStage(), Detail: detail, At: timestamppb.New(s.opts.Now())}
		job.Escalation = esc
	}
	ev := &handoffv1.JobEvent{Stage: job.GetStage(), Escalation: esc}
	switch state {
	case handoffv1.JobState_JOB_STATE_COMPLETED:
		ev.Kind = handoffv1.EventKind_EVENT_KIND_COMPLETED
	case handoffv1.JobState_JOB_STATE_ESCALATED:
		ev.Kind = handoffv1.EventKind_EVENT_KIND_ESCALATED
	default:
		ev.Kind = handoffv1.EventKind_EVENT_KIND_FAILED
	}
	s.later(job, ev) // the terminal state and its event in one write, or neither
	if err := s.save(ctx, job); err != nil {
		return err
	}
	s.log.Info("job ended", "run_id", job.GetRunId(), "job_id", job.GetJobId(), "state", state.String(), "stage", job.GetStage(), "detail", detail,
		"trace_id", traceparent.TraceID(job.GetTraceparent()))
	return nil
}
