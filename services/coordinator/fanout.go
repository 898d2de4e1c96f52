package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	hoptrace "github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store"
)

// Fan-out and fan-in. A parallel stage is one step of the run: its branches run at once, each
// a goroutine making its chain's hops, all from the package the run had when the stage began.
// Every branch hop is admitted by the runner against the job's one wallet in the same store
// round trip as any hop (store.Admit), so concurrent branches can never overspend it. The
// run is saved after every branch hop (under one lock: one writer per run), with the
// branch's state in job.branches, so a coordinator that takes the run over runs only the
// branches that had not completed. When every branch has ended, the stage's
// on_branch_failure decides; the merge after it receives every completed branch's result,
// keyed by branch, in HandoffPackage.branch_results, which the runner's completion key
// includes: one set of branch results merges once.

// errBranchStop ends a branch because the wallet is empty.
var errBranchStop = errors.New("the job's wallet is empty")

// fanOut runs the parallel stage st of job: every branch that has not completed, then the
// move the stage's policy makes.
func (s *Server) fanOut(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, w stepWallet) error {
	// The fan-out span: every branch's span is its child, and its hops theirs.
	parent, _ := hoptrace.Parse(ctx, job.GetTraceparent(), "")
	_, span := s.tracer.Start(parent, "handoff.fanout "+st.Name,
		oteltrace.WithAttributes(attribute.String("handoff.job_id", job.GetJobId()), attribute.String("handoff.stage", st.Name), attribute.String("handoff.run_id", job.GetRunId())))
	defer span.End()
	// Cancel the lease's context, not the span's: a lost lease stops every branch.
	fctx := oteltrace.ContextWithSpan(ctx, span)

	var mu sync.Mutex // one writer of job at a time: branch hops and saves
	start := s.opts.Now()
	var todo []*handoffv1.BranchState
	for i := range st.Branches {
		b := &st.Branches[i]
		bs := branchState(job, st.Name, b.Name)
		if bs == nil {
			bs = &handoffv1.BranchState{Group: st.Name, Branch: b.Name, Status: handoffv1.BranchStatus_BRANCH_STATUS_RUNNING, Stage: b.Stages[0].Name, StartedAt: timestamppb.New(start)}
			job.Branches = append(job.Branches, bs)
		}
		if bs.GetStatus() == handoffv1.BranchStatus_BRANCH_STATUS_RUNNING {
			todo = append(todo, bs)
		}
	}
	base := proto.Clone(job).(*handoffv1.Job) // the package every branch starts from

	bctx, cancelAll := context.WithCancelCause(fctx)
	defer cancelAll(nil)
	stopAll := func() { cancelAll(errBranchStop) }
	var wg sync.WaitGroup
	errs := make([]error, len(todo))
	for i, bs := range todo {
		b, _ := st.Branch(bs.GetBranch())
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.runBranch(bctx, &mu, job, base, p, st, b, bs, stopAll)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := errors.Join(errs...); err != nil {
		return err // the store failed: the step is repeated from the saved branches
	}
	return s.apply(ctx, job, p, w, afterFanOut(p, st, job), nil)
}

// runBranch makes the hops of branch b from where bs stands until it ends. It returns an
// error only when the run could not be saved.
func (s *Server) runBranch(ctx context.Context, mu *sync.Mutex, job, base *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, b *pipeline.Branch, bs *handoffv1.BranchState, stopAll func()) error {
	tctx, cancel := context.WithTimeout(ctx, st.Timeout())
	defer cancel()
	bctx, span := s.tracer.Start(tctx, "handoff.branch "+b.Name,
		oteltrace.WithAttributes(attribute.String("handoff.stage", st.Name), attribute.String("handoff.branch", b.Name), attribute.String("handoff.run_id", job.GetRunId())))
	defer span.End()
	mu.Lock()
	bs.Traceparent = hoptrace.Format(bctx)
	mu.Unlock()

	end := func(status handoffv1.BranchStatus, detail string) error {
		bs.Status, bs.Detail, bs.EndedAt = status, detail, timestamppb.New(s.opts.Now())
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_BRANCH_ENDED, Stage: bs.GetStage(), Branch: b.Name, Traceparent: bs.GetTraceparent()})
		return s.save(ctx, job)
	}
	for {
		k := chainIndex(b, bs.GetStage())
		if k < 0 {
			mu.Lock()
			defer mu.Unlock()
			return end(handoffv1.BranchStatus_BRANCH_STATUS_FAILED, fmt.Sprintf("stage %q is not in branch %s", bs.GetStage(), b.Name))
		}
		bst := &b.Stages[k]
		mu.Lock()
		if w := job.GetWallet(); w.GetHopsRemaining() == 0 || w.GetUsdRemainingMicros() == 0 {
			defer mu.Unlock()
			return end(handoffv1.BranchStatus_BRANCH_STATUS_STOPPED, errBranchStop.Error())
		}
		pkg := s.branchPackage(job, base, bs, bst)
		if bs.GetHops() == 0 {
			// The branch starts when its first package goes out, so overlapping branch
			// times on the page and in the demo are measured, not assumed.
			bs.StartedAt = timestamppb.New(s.opts.Now())
		}
		mu.Unlock()

		hctx, hspan := s.tracer.Start(bctx, "handoff.send "+bst.Name, oteltrace.WithSpanKind(oteltrace.SpanKindProducer),
			oteltrace.WithAttributes(attribute.String("handoff.stage", bst.Name), attribute.String("handoff.branch", b.Name), attribute.String("handoff.run_id", job.GetRunId())))
		pkg.Trace = &handoffv1.Trace{Traceparent: hoptrace.Format(hctx), Tracestate: job.GetTracestate()}
		// The newest version the branch stage's agent declares, as for any hop.
		runner := s.runners[bst.Runner]
		req, ver := deliverRequest(pkg, chooseVersion(s.decl.accepts(hctx, bst.Runner, bst.AgentName(), runner, s.opts.HopTimeout), job.GetDeadline() != nil), job)
		req.Agent, req.RequiredTools = bst.AgentName(), bst.Tools
		// The package the branch stage starts from is kept, as for any hop (handoff explain).
		mu.Lock()
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: bst.Name, Branch: b.Name, Traceparent: pkg.GetTrace().GetTraceparent(),
			Hop: job.GetHops() + 1, Schema: ver, Package: req.GetPackage(), PackageV2: req.GetPackageV2()})
		mu.Unlock()
		var ack *handoffv1.Ack
		var result *handoffv1.StageResult
		err := s.retry(hctx, job, bst.Name, func(ctx context.Context) error {
			var err error
			ack, result, err = rpc.Deliver(ctx, runner, req)
			return err
		})
		hspan.End()

		mu.Lock()
		if err != nil {
			defer mu.Unlock()
			switch {
			case errors.Is(tctx.Err(), context.DeadlineExceeded):
				return end(handoffv1.BranchStatus_BRANCH_STATUS_TIMED_OUT, fmt.Sprintf("branch %s ran past its timeout %s at stage %s", b.Name, st.Timeout(), bst.Name))
			case ctx.Err() != nil:
				// The run was stopped (a lost lease, Close, the wallet with on_wallet_empty:
				// stop): the branch's state stays as saved.
				if errors.Is(context.Cause(ctx), errBranchStop) && !s.stopped() {
					return end(handoffv1.BranchStatus_BRANCH_STATUS_STOPPED, errBranchStop.Error())
				}
				return nil
			}
			return end(handoffv1.BranchStatus_BRANCH_STATUS_FAILED, fmt.Sprintf("stage %s: agent runner unreachable: %v", bst.Name, err))
		}
		job.Hops++
		bs.Hops++
		if wl := ack.GetWallet(); wl != nil {
			// Acks of concurrent branches arrive in any order; the wallet only shrinks while
			// they run, so the lower is the newer.
			if cur := job.GetWallet(); cur == nil || wl.GetHopsRemaining() <= cur.GetHopsRemaining() {
				s.setWallet(job, wl)
			}
		} else if err := s.pay(ctx, job, store.Debit{Hops: 1}); err != nil {
			mu.Unlock()
			return err
		}
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: bst.Name, Branch: b.Name, Ack: ack, Traceparent: ack.GetTraceparent(), Hop: job.GetHops()})
		switch ack.GetStatus() {
		case handoffv1.AckStatus_ACK_STATUS_ACCEPTED:
		case handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
			prior := ack.GetPrior()
			result = &handoffv1.StageResult{JobId: job.GetJobId(), Stage: bst.Name, Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
				Artifacts: prior.GetArtifacts(), NextHint: prior.GetNextHint(), Traceparent: ack.GetTraceparent()}
		case handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET:
			defer mu.Unlock()
			if p.WalletEmpty() == pipeline.WalletEmptyStop {
				stopAll()
			}
			return end(handoffv1.BranchStatus_BRANCH_STATUS_STOPPED, fmt.Sprintf("stage %s: %s", bst.Name, ackDetail(ack)))
		default:
			defer mu.Unlock()
			return end(handoffv1.BranchStatus_BRANCH_STATUS_FAILED, fmt.Sprintf("stage %s answered %s: %s", bst.Name, ack.GetStatus(), ackDetail(ack)))
		}
		if result == nil || s.opts.Validator.Validate(result) != nil || result.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
			defer mu.Unlock()
			return end(handoffv1.BranchStatus_BRANCH_STATUS_FAILED, fmt.Sprintf("stage %s returned no valid completed result", bst.Name))
		}
		// The pipeline's pii policy applies to a branch's result as to any stage's, before
		// anything of it is recorded (pii.go).
		if reasons, err := s.screen(ctx, p, job.GetJobId(), result); err != nil {
			mu.Unlock()
			return err
		} else if len(reasons) > 0 {
			defer mu.Unlock()
			return end(handoffv1.BranchStatus_BRANCH_STATUS_FAILED, fmt.Sprintf("stage %s: its result holds personal data (%s): pii.policy is reject", bst.Name, reasonFields(reasons)))
		}
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_STAGE_RESULT, Stage: bst.Name, Branch: b.Name, Result: result, Traceparent: ack.GetTraceparent(), Hop: job.GetHops()})
		// Context is carried from branches too: their questions and memory refs reach the
		// merge (carry.go).
		job.OpenQuestions = carryQuestions(job.GetOpenQuestions(), result.GetOpenQuestions(), result.GetResolvedQuestions())
		job.StageMemoryRefs = addRefs(job.GetStageMemoryRefs(), job.GetMemoryRefs(), result.GetMemoryRefs())
		job.SpentUsdMicros += result.GetSpentUsdMicros()
		bs.SpentUsdMicros += result.GetSpentUsdMicros()
		if err := s.pay(ctx, job, store.Debit{USDMicros: max(result.GetSpentUsdMicros(), 0)}); err != nil {
			mu.Unlock()
			return err
		}
		bs.Artifacts = append(bs.Artifacts, result.GetArtifacts()...)
		job.Artifacts = append(job.Artifacts, result.GetArtifacts()...)
		job.ToolsTried = append(job.ToolsTried, result.GetToolsTried()...)
		if k+1 == len(b.Stages) {
			err := end(handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED, "")
			mu.Unlock()
			return err
		}
		bs.Stage = b.Stages[k+1].Name
		err = s.save(ctx, job)
		mu.Unlock()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// branchPackage is the package of branch stage bst: the run's package as the parallel stage
// began (base), with what this branch has produced so far and nothing of the other branches,
// and the wallet as it stands now.
func (s *Server) branchPackage(job, base *handoffv1.Job, bs *handoffv1.BranchState, bst *pipeline.Stage) *handoffv1.HandoffPackage {
	b := proto.Clone(base).(*handoffv1.Job)
	b.Artifacts = append(b.Artifacts, bs.GetArtifacts()...)
	b.Wallet = job.GetWallet()
	pkg := PackageOf(b, bst.Name, "")
	if s.opts.Tamper != nil {
		s.opts.Tamper(pkg)
	}
	return pkg
}

// afterFanOut is the rule once every branch of parallel stage st has ended: all completed,
// on to the merge; the wallet emptied, WALLET_EMPTY; a branch failed or timed out, the
// stage's on_branch_failure.
func afterFanOut(p *pipeline.Pipeline, st *pipeline.Stage, job *handoffv1.Job) transition {
	var failed, stopped []string
	completed := 0
	for _, bs := range job.GetBranches() {
		if bs.GetGroup() != st.Name {
			continue
		}
		switch bs.GetStatus() {
		case handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED:
			completed++
		case handoffv1.BranchStatus_BRANCH_STATUS_STOPPED:
			stopped = append(stopped, bs.GetBranch())
		default:
			failed = append(failed, fmt.Sprintf("%s (%s: %s)", bs.GetBranch(), bs.GetStatus(), bs.GetDetail()))
		}
	}
	if len(stopped) > 0 {
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY,
			fmt.Sprintf("the job's wallet emptied during parallel stage %s: branches %v made no further hop (%s)", st.Name, stopped, p.WalletEmpty()), nil)
	}
	if len(failed) > 0 {
		detail := fmt.Sprintf("parallel stage %s: branch %v", st.Name, failed)
		switch st.BranchFailure() {
		case pipeline.BranchFailFail:
			return transition{Action: actFail, Detail: detail + " (on_branch_failure: fail)"}
		case pipeline.BranchFailContinue:
			if completed > 0 {
				return onward(p, st, job, handoffv1.Move_MOVE_NEXT, false)
			}
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_BRANCH_FAILED, detail+": no branch completed, nothing to merge", nil)
		default:
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_BRANCH_FAILED, detail, nil)
		}
	}
	return onward(p, st, job, handoffv1.Move_MOVE_NEXT, false)
}

// mergeHop sends the merge stage its package with every completed branch's result keyed by
// branch; its span links every branch's span.
func (s *Server) mergeHop(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, w stepWallet) error {
	group, _ := p.ParallelBefore(st.Name)
	var links []oteltrace.Link
	var results []*handoffv1.BranchResult
	for _, bs := range job.GetBranches() {
		if group == nil || bs.GetGroup() != group.Name {
			continue
		}
		if l, ok := hoptrace.Parse(context.Background(), bs.GetTraceparent(), ""); ok {
			links = append(links, oteltrace.Link{SpanContext: oteltrace.SpanContextFromContext(l), Attributes: []attribute.KeyValue{attribute.String("handoff.branch", bs.GetBranch())}})
		}
		if bs.GetStatus() == handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED {
			results = append(results, &handoffv1.BranchResult{Branch: bs.GetBranch(), Artifacts: bs.GetArtifacts()})
		}
	}
	parent, _ := hoptrace.Parse(ctx, job.GetTraceparent(), "")
	_, span := s.tracer.Start(parent, "handoff.send "+st.Name, oteltrace.WithSpanKind(oteltrace.SpanKindProducer), oteltrace.WithLinks(links...),
		oteltrace.WithAttributes(attribute.String("handoff.job_id", job.GetJobId()), attribute.String("handoff.stage", st.Name), attribute.String("handoff.run_id", job.GetRunId())))
	defer span.End()
	// The lease's context carries the span: a lost lease still stops the hop.
	hctx := oteltrace.ContextWithSpan(ctx, span)
	pkg := s.buildPackage(job, st, hoptrace.Format(hctx))
	pkg.BranchResults = results
	return s.agentHop(hctx, job, p, st, pkg, w)
}

func branchState(job *handoffv1.Job, group, branch string) *handoffv1.BranchState {
	for _, bs := range job.GetBranches() {
		if bs.GetGroup() == group && bs.GetBranch() == branch {
			return bs
		}
	}
	return nil
}

func chainIndex(b *pipeline.Branch, stage string) int {
	for i := range b.Stages {
		if b.Stages[i].Name == stage {
			return i
		}
	}
	return -1
}

func ackDetail(ack *handoffv1.Ack) string {
	if rs := ack.GetReasons(); len(rs) > 0 {
		return rs[0].GetField() + ": " + rs[0].GetMessage()
	}
	return ack.GetStatus().String()
}
