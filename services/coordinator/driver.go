package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
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
			s.keepCarried(ctx, job)
			return context.Cause(ctx)
		}
		if s.stopped() {
			s.keepCarried(ctx, job)
			return errStopping
		}
		held, err := l.renew(ctx)
		if err == nil && !held {
			return errLeaseLost
		}
		if err != nil {
			// No step was made: the run in memory is still the one last saved (with its
			// carried move, if any), so it is kept for the next try, not read again.
			s.log.Warn("run lease renewal failed before a hop; retrying", "run_id", runID, "retry_in", backoff, "err", err)
			s.pause(ctx, &backoff)
			continue
		}
		job, err = s.advance(ctx, runID, job)
		if err == errDone {
			return nil
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		job = nil
		s.dropUnsaved(runID, err.Error())
		if errors.Is(err, errLeaseLost) { // a save or fence found a newer driver: not a store outage to wait out
			return err
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		s.log.Warn("run waits for the store", "run_id", runID, "retry_in", backoff, "err", err)
		s.pause(ctx, &backoff)
	}
}

// pause waits *backoff before a driver tries again, or less when ctx ends or Close starts
// (the loop's next turn handles both), and doubles it up to 5s.
func (s *Server) pause(ctx context.Context, backoff *time.Duration) {
	select {
	case <-ctx.Done():
	case <-s.stopping:
	case <-time.After(*backoff):
	}
	*backoff = min(2**backoff, 5*time.Second)
}

// keepCarried saves the run's carried move, if it has one, for a driver that stops (Close
// started, or its context ended: the lease given up, the drain over), so the run's next
// driver starts after that hop instead of repeating it. The save is fenced as every save
// is, so a newer driver refuses it or reads it; it is bounded by leaseTimeout and not by
// ctx, whose epoch it keeps. Best effort: a failure is logged.
func (s *Server) keepCarried(ctx context.Context, job *handoffv1.Job) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
	defer cancel()
	if err := s.flush(sctx, job); err != nil {
		s.log.Warn("driver stopped: the last hop's move was not saved; the next driver repeats the hop", "run_id", job.GetRunId(), "err", err)
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
		if job.GetParentRunId() != "" && !inSubJob(ctx) {
			// A sub-job's nested run is driven by its parent's subjob stage only (subjob.go).
			return nil, errDone
		}
		// The wallet lives in the store under the run id, where every receiver that shares
		// the store debits it, for the run's job only. Opening is idempotent: it creates the
		// wallet on the first hop (or after a crash between submit and here) and otherwise
		// returns what is left; a wallet from before wallets recorded their job becomes this
		// job's here, before any package names it.
		w, err := s.opts.Store.OpenWallet(ctx, walletOf(job), job.GetJobId(), job.GetWallet())
		if err != nil {
			return nil, fmt.Errorf("open wallet: %w", err)
		}
		saved = job.GetWallet()
		s.setWallet(job, w)
		// A driver that stopped between a verdict's save and its record left it unkept.
		if err := s.recordVerdict(ctx, job, job.GetEvaluator().GetLastVerdict()); err != nil {
			return nil, err
		}
	}
	if terminal(job.GetState()) {
		return nil, errDone
	}
	if err := s.step(ctx, job, stepWallet{saved: saved}); err != nil {
		return nil, err
	}
	return job, nil
}

// setWallet mirrors the store's wallet into the run, tagged with its id: a new Budget each
// time, never the old one changed, since events stamped before share it (stamp).
func (s *Server) setWallet(job *handoffv1.Job, w *handoffv1.Budget) {
	w = proto.Clone(w).(*handoffv1.Budget)
	w.WalletId = walletOf(job)
	job.Wallet = w
}

// debit takes d from the run's wallet in the store and mirrors the result into the run.
func (s *Server) debit(ctx context.Context, job *handoffv1.Job, d store.Debit) error {
	w, err := s.opts.Store.Debit(ctx, walletOf(job), d)
	if err != nil {
		return err
	}
	s.setWallet(job, w)
	return nil
}

// step makes one hop of a RUNNING run and saves the outcome. w is the step's wallet
// arithmetic (stepWallet): when the step repeats one whose save failed, what that step paid
// is not charged again. The rules are next's (rules.go); step only sends, debits and saves.
func (s *Server) step(ctx context.Context, job *handoffv1.Job, w stepWallet) error {
	p := s.opts.Pipelines[job.GetPipeline()]
	t := next(p, job, w, outcome{Now: s.opts.Now()})
	if t.Action != actSend {
		return s.apply(ctx, job, p, w, t, nil)
	}
	st, _, _ := p.Stage(job.GetStage())
	if t, stop, err := s.piiBeforeSend(ctx, p, job); err != nil {
		return err
	} else if stop {
		return s.apply(ctx, job, p, w, t, nil)
	}
	if st.IsParallel() || st.IsSubJob() {
		// Their first writes are not a package sent: the carried move is saved first.
		if err := s.flush(ctx, job); err != nil {
			return err
		}
	}
	switch {
	case st.IsParallel():
		return s.fanOut(ctx, job, p, st, w) // fanout.go
	case st.IsSubJob():
		return s.subJob(ctx, job, p, st, w) // subjob.go
	case st.IsMerge():
		return s.mergeHop(ctx, job, p, st, w) // fanout.go
	}
	// The hop's send span: a child of the job's trace, and the parent of the receiver's
	// ack span through the package's traceparent (and of the gRPC client span). Hop calls
	// run under the span (so gRPC metadata carries it); saving state does not depend on it.
	hctx, tp, end := s.hopSpan(ctx, job, st)
	defer end()
	pkg := s.buildPackage(job, st, tp)
	if st.IsWriteback() {
		return s.writeback(hctx, job, p, st, pkg, w, t.Artifact)
	}
	return s.agentHop(hctx, job, p, st, pkg, w)
}

// pay takes d from the run's wallet, if it takes anything: a hop the wallet cannot cover is
// not an error (the hop was made; the next step's checks stop the run).
func (s *Server) pay(ctx context.Context, job *handoffv1.Job, d store.Debit) error {
	if d == (store.Debit{}) {
		return nil // a zero debit changes nothing: the wallet in the run is already current
	}
	if err := s.debit(ctx, job, d); err != nil && !errors.Is(err, store.ErrWalletEmpty) {
		return err
	}
	return nil
}

// buildPackage makes the package for stage st from the run's durable state alone. Goal and
// constraints come from intake and nothing else can change them. The origin says how the
// job came to st: where from, and by which move or route; never what the stage before said.
func (s *Server) buildPackage(job *handoffv1.Job, st *pipeline.Stage, tp string) *handoffv1.HandoffPackage {
	pkg := PackageOf(job, st.Name, tp)
	if ps := job.GetParentStage(); ps != "" {
		// A sub-job's stages are its parent stage's: their completion keys never meet the
		// parent's own stages of the same name.
		pkg.Stage = subStage(ps, st.Name)
	}
	if s.opts.Tamper != nil {
		s.opts.Tamper(pkg)
	}
	return pkg
}

// PackageOf is the handoff.v1 package the rail sends stage from run job's durable state as
// it stands, with traceparent tp (a copy: nothing is shared with job). `handoff contract
// check-data` reads stored runs through it, so what it checks is what the rail sends.
func PackageOf(job *handoffv1.Job, stage, tp string) *handoffv1.HandoffPackage {
	pkg := &handoffv1.HandoffPackage{
		Schema:        contract.V1,
		JobId:         job.GetJobId(),
		Stage:         stage,
		Goal:          job.GetGoal(),
		Constraints:   job.GetConstraints(),
		Artifacts:     last(job.GetArtifacts()),
		OpenQuestions: lastN(job.GetOpenQuestions(), maxQuestions),
		ToolsTried:    last(job.GetToolsTried()),
		Evaluator:     job.GetEvaluator(),
		Budget:        job.GetWallet(),
		MemoryRefs:    memoryRefs(job),
		Trace:         &handoffv1.Trace{Traceparent: tp, Tracestate: job.GetTracestate()},
		NextHint:      job.GetNextHint(),
		// A stage a person sent the run back to is a new completion for the runner.
		OperatorReturns: job.GetOperatorReturns(),
	}
	if t := lastTransfer(job); t != nil && t.GetToStage() == stage {
		pkg.Origin = &handoffv1.Origin{Stage: t.GetFromStage(), Move: t.GetMove(), Route: t.GetRoute()}
		// A stage a route sent the run back to is a new completion too.
		pkg.Visit = t.GetVisit()
	}
	return proto.Clone(pkg).(*handoffv1.HandoffPackage)
}

func last[T any](xs []T) []T { return lastN(xs, maxCarried) }

func lastN[T any](xs []T, n int) []T {
	if len(xs) > n {
		return xs[len(xs)-n:]
	}
	return xs
}

// routeOptions are the routes stage st offers its agent.
func routeOptions(st *pipeline.Stage) []*handoffv1.RouteOption {
	var out []*handoffv1.RouteOption
	for _, r := range st.Routes {
		out = append(out, &handoffv1.RouteOption{Name: r.Name, Description: r.Description})
	}
	return out
}

// agentHop sends the package to the stage's agent runner, debits and records what it
// answered, and applies next's verdict on it.
func (s *Server) agentHop(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, pkg *handoffv1.HandoffPackage, w stepWallet) error {
	runner := s.runners[st.Runner]
	dec, known := s.decl.declared(st.Runner)
	if !known {
		// Asking the runner what it accepts is a call that may wait: the carried move is
		// not left unsaved behind it.
		if err := s.flush(ctx, job); err != nil {
			return err
		}
		dec = s.decl.describe(ctx, st.Runner, runner, s.opts.HopTimeout)
	}
	// The newest version the stage's agent declares, converted from the run's state.
	request := func() (*handoffv1.DeliverRequest, string) {
		ver := chooseVersion(dec.accepts(st.AgentName()), job.GetDeadline() != nil)
		req, ver := deliverRequest(pkg, ver, job)
		req.Agent, req.RequiredTools, req.Routes = st.AgentName(), st.Tools, routeOptions(st)
		return req, ver
	}
	req, ver := request()
	hop := job.GetHops() + 1
	sentEv := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: st.Name, Traceparent: pkg.GetTrace().GetTraceparent(), Hop: hop, Schema: ver}
	// The exact package sent, so the hop can be explained later from what the stage started
	// from (explain.go); the request holds the one version sent.
	sentEv.Package, sentEv.PackageV2 = req.GetPackage(), req.GetPackageV2()
	sent, err := s.announce(ctx, job, sentEv)
	if err != nil {
		return err
	}

	var ack *handoffv1.Ack
	var result *handoffv1.StageResult
	err = s.retry(ctx, job, st.Name, func(ctx context.Context) error {
		var err error
		ack, result, err = rpc.Deliver(ctx, runner, req)
		if err == nil && refusedVersion(ack) {
			// The runner no longer takes what it declared (downgraded in place): ask it
			// again, and resend once in what it declares now, if that is another version.
			s.decl.forget(st.Runner)
			dec = s.decl.describe(ctx, st.Runner, runner, s.opts.HopTimeout)
			if again, v := request(); v != ver {
				s.log.Info("runner refused the version it declared; resending", "run_id", job.GetRunId(), "stage", st.Name, "sent", ver, "now", v)
				req, ver = again, v
				ack, result, err = rpc.Deliver(ctx, runner, req)
			}
		}
		return err
	})
	sent()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.apply(ctx, job, p, w, next(p, job, w, outcome{Sent: true, Err: err}), nil)
	}

	// The hop happened: one hop off the wallet, whatever the ack says. A receiver that
	// shares the store has already taken it (and says so in ack.wallet); otherwise the rail
	// takes it here, so each hop is debited exactly once.
	job.Hops = hop
	if wl := ack.GetWallet(); wl != nil {
		s.setWallet(job, wl)
	} else if err := s.pay(ctx, job, w.hop(job.GetWallet())); err != nil {
		return err
	}
	outcomeEv := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: st.Name, Ack: ack, Traceparent: ack.GetTraceparent(), Hop: hop}
	s.later(job, outcomeEv)

	out := outcome{Sent: true, Ack: ack}
	verdict := handoffv1.Verdict_VERDICT_UNSPECIFIED
	switch ack.GetStatus() {
	case handoffv1.AckStatus_ACK_STATUS_ACCEPTED:
	case handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
		// The stage already completed for this job: take its first result (and route), do no
		// new work.
		prior := ack.GetPrior()
		result = &handoffv1.StageResult{
			JobId: job.GetJobId(), Stage: st.Name, Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
			Artifacts: prior.GetArtifacts(), Evaluator: prior.GetEvaluator(), NextHint: prior.GetNextHint(),
			Route: prior.GetRoute(), Traceparent: ack.GetTraceparent(),
		}
	default:
		result = nil
	}
	if result != nil {
		// Personal data in the result is refused or redacted before any of it is recorded.
		piiReasons, err := s.screen(ctx, p, job.GetJobId(), result)
		if err != nil {
			return err
		}
		if piiReasons != nil {
			out.Invalid = piiReasons
		} else if err := s.opts.Validator.Validate(result); err != nil {
			out.Invalid = contract.Reasons(err) // nothing of an invalid result enters the run
		} else {
			out.Result = result
			// One wallet: the stage's spend comes off it, never below zero.
			job.SpentUsdMicros += result.GetSpentUsdMicros()
			if err := s.pay(ctx, job, w.spend(result.GetSpentUsdMicros())); err != nil {
				return err
			}
			outcomeEv = &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_STAGE_RESULT, Stage: st.Name, Result: result, Traceparent: ack.GetTraceparent(), Hop: hop}
			s.later(job, outcomeEv)
			if result.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_FAILED {
				job.Artifacts = append(job.Artifacts, result.GetArtifacts()...)
				job.ToolsTried = append(job.ToolsTried, result.GetToolsTried()...)
				// Context is carried, not overwritten: the stage's questions are added, and
				// only those it names as resolved are removed (carry.go).
				job.OpenQuestions = carryQuestions(job.GetOpenQuestions(), result.GetOpenQuestions(), result.GetResolvedQuestions())
				job.StageMemoryRefs = addRefs(job.GetStageMemoryRefs(), job.GetMemoryRefs(), result.GetMemoryRefs())
				job.NextHint = result.GetNextHint()
				if ev := result.GetEvaluator(); st.Judges() && ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_UNSPECIFIED {
					// Evaluator state travels: every later package carries this verdict, and
					// once the run is saved with it the store keeps it beside the wallet
					// (recordVerdict).
					job.Evaluator = ev
					verdict = ev.GetLastVerdict()
					outcomeEv = &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_VERDICT, Stage: st.Name, Evaluator: ev, Traceparent: ack.GetTraceparent(), Hop: hop}
					s.later(job, outcomeEv)
				}
			}
		}
	}
	// A move without a verdict waits for the next package sent, and is saved with it. A
	// verdict is recorded only after the run is saved with it (recordVerdict), and a nested
	// run's driver (subjob.go) has no flush when it stops: both are saved now.
	carry := verdict == handoffv1.Verdict_VERDICT_UNSPECIFIED && !inSubJob(ctx)
	if err := s.applyCarried(ctx, job, p, w, next(p, job, w, out), outcomeEv, carry); err != nil {
		return err
	}
	return s.recordVerdict(ctx, job, verdict)
}

// recordVerdict keeps the verdict the run was just saved with beside its wallet, where every
// receiver's admission refuses a package that drops it (store.ErrSilentReset). After the
// save, never before: a step whose save failed is repeated from the run without the
// verdict, and its judge must not find it recorded. A failure here reloads the run, and
// loading records its verdict again (advance), so the next hop is not sent before it is
// kept.
func (s *Server) recordVerdict(ctx context.Context, job *handoffv1.Job, v handoffv1.Verdict) error {
	if v == handoffv1.Verdict_VERDICT_UNSPECIFIED {
		return nil
	}
	// Verdicts are kept beside the wallet the hops are admitted against: a sub-job's are
	// its parent's, whose wallet it spends.
	if err := s.opts.Store.RecordVerdict(ctx, walletOf(job), v); err != nil {
		return fmt.Errorf("record verdict of run %s: %w", job.GetRunId(), err)
	}
	return nil
}

// writeback calls the writeback service for the artifact next chose (after a judge's PASS
// only), and applies next's verdict on the answer.
func (s *Server) writeback(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, pkg *handoffv1.HandoffPackage, w stepWallet, art *handoffv1.Artifact) error {
	hop := job.GetHops() + 1
	sent, err := s.announce(ctx, job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: st.Name, Traceparent: pkg.GetTrace().GetTraceparent(), Hop: hop, Package: pkg})
	if err != nil {
		return err
	}
	req := &handoffv1.WriteRequest{Package: pkg, Artifact: art, Target: st.Writer.Target}
	var resp *handoffv1.WriteResponse
	err = s.retry(ctx, job, st.Name, func(ctx context.Context) error {
		var err error
		resp, err = s.opts.Writeback.Write(ctx, req)
		return err
	})
	sent()
	job.Hops = hop
	// The rail pays the writeback hop itself (nothing else debits between the previous
	// stage's save and this one).
	if derr := s.pay(ctx, job, w.hop(job.GetWallet())); derr != nil {
		return derr
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.apply(ctx, job, p, w, next(p, job, w, outcome{Sent: true, Err: err}), nil)
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
	receipt := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_RECEIPT, Stage: st.Name, Receipt: resp.GetReceipt(), Traceparent: tp, Hop: hop}
	s.later(job, receipt)
	return s.apply(ctx, job, p, w, next(p, job, w, outcome{Sent: true, Receipt: resp.GetReceipt()}), receipt)
}

// apply carries out transition t: it records the move (in the run, and on ev, the hop's last
// outcome event, when there is one), debits a revision, and saves the run where t leaves it.
func (s *Server) apply(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, w stepWallet, t transition, ev *handoffv1.JobEvent) error {
	return s.applyCarried(ctx, job, p, w, t, ev, false)
}

// applyCarried is apply, but with carry a move to another stage is not saved here: it waits
// for the next step, which writes it with the package it sends (carry, announce).
func (s *Server) applyCarried(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, w stepWallet, t transition, ev *handoffv1.JobEvent, carry bool) error {
	if t.Revision {
		// Critique loop: one revision off the wallet. The store may hold none after all.
		if err := s.debit(ctx, job, store.Debit{Revisions: 1}); errors.Is(err, store.ErrWalletEmpty) && t.NoRevision != nil {
			t = *t.NoRevision
		} else if err != nil {
			return err
		}
	}
	if t.Stale {
		job.Evaluator = withStaleFailure(job.GetEvaluator())
	}
	if t.Transfer != nil {
		job.Transfers = append(job.Transfers, t.Transfer)
		if ev != nil {
			ev.Transfer = t.Transfer
		}
	}
	switch t.Action {
	case actMove:
		if t.Transfer.GetMove() == handoffv1.Move_MOVE_REVISE {
			job.Revisions++
		}
		job.Stage = t.Transfer.GetToStage()
		if carry {
			s.carry(job.GetRunId())
			return nil
		}
		return s.save(ctx, job)
	case actComplete:
		return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_COMPLETED, nil, "", t.Transfer)
	case actEscalate:
		return s.escalate(ctx, job, p, t.Cause, t.Detail, t.Reasons, t.Transfer)
	case actFail:
		return s.finish(ctx, job, handoffv1.JobState_JOB_STATE_FAILED, nil, t.Detail, nil)
	}
	return fmt.Errorf("coordinator: transition %s cannot be applied here", t.Action)
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
		backoff = nextBackoff(backoff, status.Code(err))
	}
}

// nextBackoff is the pause before the retry after one of backoff that failed with code:
// doubled, up to a ceiling. A peer that is down (Unavailable) is retried at least every
// 500ms: the connection's own reconnect backoff (rpc.Reconnect) decides when it is dialled,
// so a retry while it is down fails in the process without traffic, and a runner restarted
// in a moment gets the hop within half a second. A peer that is up and asked for patience
// (Aborted: in flight elsewhere; ResourceExhausted) or too slow (DeadlineExceeded) waits
// up to 2s.
func nextBackoff(backoff time.Duration, code codes.Code) time.Duration {
	ceiling := 2 * time.Second
	if code == codes.Unavailable {
		ceiling = 500 * time.Millisecond
	}
	return min(2*backoff, ceiling)
}

// save writes the run together with its waiting events (later). When the write fails, the
// events are dropped with the state they belong to.
func (s *Server) save(ctx context.Context, job *handoffv1.Job) error {
	job.UpdatedAt = timestamppb.New(s.opts.Now())
	evs := s.takePending(job.GetRunId())
	var err error
	if epoch, ok := epochOf(ctx); ok { // a driver's save: fenced by its epoch
		err = s.opts.Store.PutRunFenced(ctx, job, epoch, evs...)
	} else {
		err = s.opts.Store.PutRun(ctx, job, evs...)
	}
	if err != nil {
		// Neither the state nor its events were written: the step will be repeated from the
		// last saved state and record them again, so they are not kept for a later save.
		s.logDropped(job.GetRunId(), evs, err.Error())
		if errors.Is(err, store.ErrFenced) { // taken over: stop as a lost lease does
			return fmt.Errorf("save run %s: %w: %w", job.GetRunId(), errLeaseLost, err)
		}
		return fmt.Errorf("save run %s: %w", job.GetRunId(), err)
	}
	if len(evs) > 0 {
		s.published(job.GetRunId(), evs)
	}
	return nil
}

// escalate hands the run to a person: ESCALATED with cause, at the pipeline's escalation
// route. tr is the move that escalated it (a route to escalate), or nil.
func (s *Server) escalate(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, cause handoffv1.EscalationCause, detail string, reasons []*handoffv1.Reason, tr *handoffv1.Transfer) error {
	job.Escalations = max(job.GetEscalations(), job.GetResolution().GetEscalation().GetNumber()) + 1
	job.Escalation = &handoffv1.Escalation{
		Cause: cause, Stage: job.GetStage(), Detail: detail, Reasons: reasons,
		Route: p.Escalation.Route, At: timestamppb.New(s.opts.Now()), Number: job.Escalations,
	}
	if err := s.finish(ctx, job, handoffv1.JobState_JOB_STATE_ESCALATED, job.Escalation, detail, tr); err != nil {
		return err
	}
	s.deliver(job, p)
	return nil
}

// finish saves the run in a terminal state and records the last event, with tr, the move
// that ended the run (a route to escalate or end), when there is one.
func (s *Server) finish(ctx context.Context, job *handoffv1.Job, state handoffv1.JobState, esc *handoffv1.Escalation, detail string, tr *handoffv1.Transfer) error {
	job.State = state
	if state == handoffv1.JobState_JOB_STATE_FAILED {
		if esc == nil {
			// The rail itself could not go on (a peer unreachable past every retry, a pipeline
			// gone): no escalation cause, but the run still says why it stopped.
			esc = &handoffv1.Escalation{Stage: job.GetStage(), Detail: detail, At: timestamppb.New(s.opts.Now())}
		}
		// A person's fail passes the escalation it decided: its cause and route stay on the
		// run beside the decision, never erased.
		job.Escalation = esc
	}
	ev := &handoffv1.JobEvent{Stage: job.GetStage(), Escalation: esc, Transfer: tr}
	switch state {
	case handoffv1.JobState_JOB_STATE_COMPLETED:
		ev.Kind = handoffv1.EventKind_EVENT_KIND_COMPLETED
	case handoffv1.JobState_JOB_STATE_ESCALATED:
		ev.Kind = handoffv1.EventKind_EVENT_KIND_ESCALATED
	default:
		ev.Kind = handoffv1.EventKind_EVENT_KIND_FAILED
	}
	var orphans []*handoffv1.SubJobRef
	if state != handoffv1.JobState_JOB_STATE_ESCALATED { // an escalated parent may resume its nested run (a return to its stage)
		for _, c := range job.GetChildren() {
			if c.GetState() == handoffv1.JobState_JOB_STATE_RUNNING {
				c.State = handoffv1.JobState_JOB_STATE_FAILED
				orphans = append(orphans, c)
			}
		}
	}
	s.later(job, ev) // the terminal state and its event in one write, or neither
	if err := s.save(ctx, job); err != nil {
		for _, c := range orphans {
			c.State = handoffv1.JobState_JOB_STATE_RUNNING // not saved: as it was
		}
		return err
	}
	if s.log.Enabled(ctx, slog.LevelInfo) { // built only when written: every job passes here
		s.log.Info("job ended", "run_id", job.GetRunId(), "job_id", job.GetJobId(), "state", state.String(), "stage", job.GetStage(), "detail", detail,
			"trace_id", traceparent.TraceID(job.GetTraceparent()))
	}
	for _, c := range orphans {
		s.endChild(ctx, job, c.GetRunId())
	}
	return nil
}

// endChild fails the nested run runID that its parent job left RUNNING as it ended (its
// deadline passed, or a person failed it, before its subjob stage resumed the nested run):
// nothing else would ever end it, since only its parent's driver drives a nested run and
// decisions on it are refused. It is fenced and saved under the parent's epoch, as the
// subjob stage saves it. Best effort: the parent has ended already, so a failure is logged.
func (s *Server) endChild(ctx context.Context, job *handoffv1.Job, runID string) {
	err := func() error {
		if epoch, ok := epochOf(ctx); ok {
			if err := s.opts.Store.FenceRunAt(ctx, runID, epoch); err != nil {
				return err
			}
		}
		child, err := s.opts.Store.GetRun(ctx, runID)
		if errors.Is(err, store.ErrNotFound) || err == nil && terminal(child.GetState()) {
			return nil
		} else if err != nil {
			return err
		}
		return s.finish(context.WithValue(ctx, subJobKey{}, true), child, handoffv1.JobState_JOB_STATE_FAILED, nil,
			fmt.Sprintf("its parent run %s ended %s", job.GetRunId(), strings.TrimPrefix(job.GetState().String(), "JOB_STATE_")), nil)
	}()
	if err != nil {
		s.log.Warn("could not end the nested run of an ended parent; it stays RUNNING", "run_id", runID, "parent_run_id", job.GetRunId(), "err", err)
	}
}
