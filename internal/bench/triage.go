package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// triageRig is figure J_triage: the shipped support-triage pipeline (routes, its own
// deterministic agents, the judge and the writeback) on `handoff up`'s assembly
// (stack.Start on bbolt), fed the sample billing ticket: intake routes it to the billing
// desk, the retriever routes a hit to the drafter, the judge passes it and the writeback
// patches the CRM, once per job.
type triageRig struct {
	st     *stack.Stack
	dir    string
	client handoffv1.CoordinatorServiceClient
	ticket []byte
	prefix string
	seq    atomic.Uint64
}

func newTriageRig(ctx context.Context, baseDir string, log *slog.Logger) (_ *triageRig, err error) {
	if log == nil {
		log = quietLogger()
	}
	r := &triageRig{prefix: "tkt_" + randomHex(4)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.ticket, err = support.Ticket(support.TopicBilling); err != nil {
		return nil, err
	}
	if r.dir, err = os.MkdirTemp(baseDir, "handoff-bench-triage-"); err != nil {
		return nil, err
	}
	// No Pipelines or Agents: stack.Start serves the shipped pipelines with their agents.
	if r.st, err = stack.Start(ctx, stack.Config{DataDir: r.dir, CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0", Logger: log}); err != nil {
		return nil, err
	}
	cc, err := r.st.DialAs(r.st.CoordinatorAddr, "operator")
	if err != nil {
		return nil, err
	}
	r.client = handoffv1.NewCoordinatorServiceClient(cc)
	return r, nil
}

// job submits the billing ticket as a new job and watches it to its end: it must complete
// (billing route, judge PASS, one write).
func (r *triageRig) job(ctx context.Context, _ int) error {
	id := fmt.Sprintf("%s_%d", r.prefix, r.seq.Add(1))
	in, err := r.st.Artifacts.Put(ctx, artifact.Ref{JobID: id, Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, r.ticket)
	if err != nil {
		return err
	}
	resp, err := r.client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		JobId: id, Pipeline: demo.TriagePipeline, Goal: demo.Goal, Constraints: demo.Constraints,
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_200_000}, Inputs: []*handoffv1.Artifact{in},
	})
	if err != nil {
		return fmt.Errorf("submit %s: %w", id, err)
	}
	if _, err := demo.Watch(ctx, r.client, resp.GetJob().GetRunId(), nil); err != nil {
		return err
	}
	got, err := r.client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
	if err != nil {
		return err
	}
	if j := got.GetJob(); j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		return fmt.Errorf("triage job %s ended %s at %s: %s", id, j.GetState(), j.GetStage(), j.GetEscalation().GetDetail())
	}
	return nil
}

func (r *triageRig) close() {
	if r.st != nil {
		r.st.Close()
	}
	if r.dir != "" {
		os.RemoveAll(r.dir)
	}
}
