package coordinator

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	hoptrace "github.com/handoffhq/handoff/internal/interceptor/trace"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/store"
)

// Sub-jobs. A subjob stage starts a nested run of another declared pipeline: a run of its own
// in the store (Job.parent_run_id, visible in the parent's Job.children), with the parent's
// job id, on the parent's wallet (Job.wallet_run_id: every hop and spend of the nested run
// comes off it), in the parent's trace (its hop spans are children of the stage's span), and
// with its own hop cap (subjob.max_hops). The parent's driver drives it hop by hop, in the
// same goroutine, under the parent's lease; no replica drives a nested run on its own. When
// it ends, only its final artifact (subjob.output) enters the parent: never its intermediate
// artifacts or packages. Its escalation escalates the parent.
//
// A nested run is fenced as its parent is, by the epoch of the parent's driver: before it
// reads or creates the nested run the driver moves the nested run's own fence up to its
// epoch (store.Fences.FenceRunAt), and saves it under that epoch. The fence lives beside
// the nested run (its own slot on Redis Cluster), so each save checks it in its own
// script, and a driver of the parent that stalled past its lease can neither save the
// nested run after the takeover (ErrFenced) nor take it back (its epoch is older).
//
// Nothing but its parent's driver ever drives or decides a nested run, so a parent that
// ends (FAILED or COMPLETED; not ESCALATED, which may return to the subjob stage) with its
// nested run still RUNNING ends that run FAILED too (finish, endChild).

type subJobKey struct{}

// inSubJob reports whether ctx is a subjob stage driving its nested run.
func inSubJob(ctx context.Context) bool { return ctx.Value(subJobKey{}) != nil }

// walletOf is the run whose wallet pays job's hops: its parent's, for a nested run.
func walletOf(job *handoffv1.Job) string {
	if id := job.GetWalletRunId(); id != "" {
		return id
	}
	return job.GetRunId()
}

// subStage is the stage name a nested run's stage is delivered as.
func subStage(parent, stage string) string {
	name := parent + "-" + stage
	if len(name) > 64 {
		name = name[:64]
	}
	return name
}

// subRunID is the run id of the nested run a subjob stage starts on its n-th arrival.
func subRunID(parent *handoffv1.Job, stage string, n int) string {
	return fmt.Sprintf("%s-%s-%d", parent.GetRunId(), stage, n)
}

// subJob runs the subjob stage st of job: it starts (or, after a takeover, resumes) the
// nested run, drives it to its end, and applies what it returned.
func (s *Server) subJob(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, w stepWallet) error {
	sj := st.SubJob
	sub := s.opts.Pipelines[sj.Pipeline]
	if sub == nil {
		return s.apply(ctx, job, p, w, transition{Action: actFail, Detail: fmt.Sprintf("stage %s: sub-job pipeline %q is not loaded", st.Name, sj.Pipeline)}, nil)
	}
	ref := currentChild(job, st.Name)
	parent, _ := hoptrace.Parse(ctx, job.GetTraceparent(), "")
	sctx, span := s.tracer.Start(parent, "handoff.subjob "+st.Name,
		oteltrace.WithAttributes(attribute.String("handoff.job_id", job.GetJobId()), attribute.String("handoff.stage", st.Name),
			attribute.String("handoff.run_id", job.GetRunId()), attribute.String("handoff.subjob.pipeline", sub.Name)))
	defer span.End()
	tp := hoptrace.Format(sctx)
	// The nested run's saves are fenced by this driver's epoch (save reads it from cctx),
	// and its driver knows it is one.
	cctx := context.WithValue(oteltrace.ContextWithSpan(ctx, span), subJobKey{}, true)
	fenced := false
	fence := func(runID string) error {
		epoch, ok := epochOf(ctx)
		if !ok || fenced {
			return nil // not a leased driver: nothing to fence with (its saves are unfenced too)
		}
		if err := s.opts.Store.FenceRunAt(ctx, runID, epoch); err != nil {
			if errors.Is(err, store.ErrFenced) { // a newer driver of the parent holds it: stop as a lost lease does
				return fmt.Errorf("fence sub-job run %s: %w: %w", runID, errLeaseLost, err)
			}
			return fmt.Errorf("fence sub-job run %s: %w", runID, err)
		}
		fenced = true
		return nil
	}

	if ref == nil {
		n := 0
		for _, c := range job.GetChildren() {
			if c.GetStage() == st.Name {
				n++
			}
		}
		// Parent fields from its creation on: a scan that lists the nested run while it is
		// new sees whose it is and leaves it to its parent's driver.
		child := &handoffv1.Job{
			RunId: subRunID(job, st.Name, n), Pipeline: sub.Name, State: handoffv1.JobState_JOB_STATE_RUNNING,
			Goal: sj.Objective, Constraints: job.GetConstraints(), Stage: sub.First().Name,
			Artifacts: last(job.GetArtifacts()), MemoryRefs: job.GetMemoryRefs(), Traceparent: tp,
			CreatedAt: timestamppb.New(s.opts.Now()), Deadline: job.GetDeadline(),
			ParentRunId: job.GetRunId(), ParentStage: st.Name, WalletRunId: walletOf(job),
		}
		if err := fence(child.GetRunId()); err != nil {
			return err
		}
		// Created without a job id or wallet (CreateRun fixes a job id's content by its first
		// run, the parent's, and would open a wallet of the nested run's own), then given the
		// parent's job id and wallet, which it pays from.
		if _, err := s.opts.Store.GetRun(ctx, child.GetRunId()); errors.Is(err, store.ErrNotFound) {
			if _, _, err := s.opts.Store.CreateRun(ctx, child); err != nil {
				return fmt.Errorf("create sub-job run: %w", err)
			}
		} else if err != nil {
			return err
		}
		child.JobId, child.Wallet = job.GetJobId(), job.GetWallet()
		if err := s.save(cctx, child); err != nil {
			return fmt.Errorf("save sub-job run: %w", err)
		}
		ref = &handoffv1.SubJobRef{Stage: st.Name, RunId: child.GetRunId(), Pipeline: sub.Name, State: handoffv1.JobState_JOB_STATE_RUNNING}
		job.Children = append(job.Children, ref)
		s.later(job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBJOB_STARTED, Stage: st.Name, SubRunId: ref.GetRunId(), Traceparent: tp})
		if err := s.save(ctx, job); err != nil {
			return err
		}
	}

	// Drive the nested run hop by hop from the store, as any driver resumes a run: once its
	// fence is this driver's, so what it reads is the nested run's last state for good.
	if err := fence(ref.GetRunId()); err != nil {
		return err
	}
	var child *handoffv1.Job
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var err error
		if child == nil {
			if child, err = s.opts.Store.GetRun(ctx, ref.GetRunId()); err != nil {
				return err
			}
			if !terminal(child.GetState()) {
				wl, err := s.opts.Store.OpenWallet(ctx, walletOf(child), child.GetJobId(), child.GetWallet())
				if err != nil {
					return err
				}
				s.setWallet(child, wl)
			}
		}
		if terminal(child.GetState()) {
			break
		}
		cur, _, _ := sub.Stage(child.GetStage())
		switch {
		case cur != nil && cur.IsWriteback() && sj.Stop == pipeline.StopJudged:
			// Stop condition: its judge passed the output; the write is the parent's.
			err = s.finish(cctx, child, handoffv1.JobState_JOB_STATE_COMPLETED, nil, "stopped at its judge's PASS (stop: judged)", nil)
		case child.GetHops() >= uint32(sj.MaxHops):
			err = s.escalate(cctx, child, sub, handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP, fmt.Sprintf("sub-job hop cap reached after %d hops (subjob.max_hops)", child.GetHops()), nil, nil)
		default:
			err = s.step(cctx, child, stepWallet{})
		}
		if err != nil {
			child = nil // read it again from the store
			// As the parent's driver does for its own run (run, launch): the nested step is
			// repeated from the nested run as saved, and records its events again then.
			s.dropUnsaved(ref.GetRunId(), err.Error())
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}

	// Control comes back: only the final artifact returns.
	ref.State, ref.Hops, ref.Escalation = child.GetState(), child.GetHops(), child.GetEscalation()
	job.SpentUsdMicros += child.GetSpentUsdMicros()
	if wl, err := s.opts.Store.OpenWallet(ctx, walletOf(job), job.GetJobId(), job.GetWallet()); err == nil {
		s.setWallet(job, wl)
	} else {
		return err
	}
	var t transition
	switch child.GetState() {
	case handoffv1.JobState_JOB_STATE_COMPLETED:
		art := latestArtifact(child.GetArtifacts(), sj.Output)
		if art == nil {
			t = escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_SUBJOB_ESCALATED, fmt.Sprintf("sub-job %s (run %s) ended without its output %s", st.Name, child.GetRunId(), sj.Output), nil)
			break
		}
		ref.Artifact = proto.Clone(art).(*handoffv1.Artifact)
		job.Artifacts = append(job.Artifacts, ref.GetArtifact())
		// The sub-job's judge passed what returns, on the wallet both share: the parent
		// carries that PASS on, so its next package agrees with the wallet's verdicts
		// (store.Admit refuses a package that drops a verdict after a FAIL).
		if child.GetEvaluator().GetLastVerdict() == handoffv1.Verdict_VERDICT_PASS {
			ev := &handoffv1.Evaluator{}
			if job.GetEvaluator() != nil {
				ev = proto.Clone(job.GetEvaluator()).(*handoffv1.Evaluator)
			}
			ev.LastVerdict = handoffv1.Verdict_VERDICT_PASS
			job.Evaluator = ev
		}
		t = onward(p, st, job, handoffv1.Move_MOVE_NEXT, false)
	case handoffv1.JobState_JOB_STATE_ESCALATED:
		t = escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_SUBJOB_ESCALATED,
			fmt.Sprintf("sub-job %s (run %s) escalated %s: %s", st.Name, child.GetRunId(), child.GetEscalation().GetCause(), child.GetEscalation().GetDetail()), child.GetEscalation().GetReasons())
	default:
		t = transition{Action: actFail, Detail: fmt.Sprintf("sub-job %s (run %s) failed: %s", st.Name, child.GetRunId(), child.GetEscalation().GetDetail())}
	}
	ev := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBJOB_ENDED, Stage: st.Name, SubRunId: child.GetRunId(), Traceparent: tp}
	s.later(job, ev)
	return s.apply(ctx, job, p, w, t, ev)
}

// currentChild is the nested run stage started and has not finished with, if any.
func currentChild(job *handoffv1.Job, stage string) *handoffv1.SubJobRef {
	for _, c := range job.GetChildren() {
		if c.GetStage() == stage && c.GetState() == handoffv1.JobState_JOB_STATE_RUNNING {
			return c
		}
	}
	return nil
}
