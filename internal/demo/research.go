package demo

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/traceparent"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// ResearchPipeline is the shipped pipeline with a fan-out, a merge that judges and a
// sub-job.
const ResearchPipeline = "research-brief"

// ResearchRun is the sample ticket's run through research-brief.
type ResearchRun struct {
	Job    *handoffv1.Job
	Events []*handoffv1.JobEvent
	// Child is the sub-job's nested run.
	Child *handoffv1.Job
}

// RunResearch submits the sample ticket to research-brief and prints its events as they
// come (branch events carry their branch), then the branches side by side with their times,
// and the sub-job with the artifact it returned.
func RunResearch(ctx context.Context, out io.Writer, cc grpc.ClientConnInterface, arts artifact.Store) (*ResearchRun, error) {
	client := handoffv1.NewCoordinatorServiceClient(cc)
	input, err := arts.Put(ctx, artifact.Ref{JobID: JobID, Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
	if err != nil {
		return nil, fmt.Errorf("store the sample ticket: %w", err)
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		RequestId: "demo-research", JobId: JobID, Pipeline: ResearchPipeline, Goal: Goal, Constraints: Constraints,
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_200_000}, Inputs: []*handoffv1.Artifact{input}, MemoryRefs: []string{"customer_id:cus_9"},
	})
	if err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	job := resp.GetJob()
	fmt.Fprintf(out, "handoff demo: pipeline %s, ticket %s\n", ResearchPipeline, JobID)
	fmt.Fprintf(out, "run %s  job %s  trace %s\n", job.GetRunId(), job.GetJobId(), traceparent.TraceID(job.GetTraceparent()))
	fmt.Fprintf(out, " %-5s  %-15s  %-8s  %-16s  %s\n", "hop", "stage", "branch", "event", "outcome")
	evs, err := Watch(ctx, client, job.GetRunId(), func(ev *handoffv1.JobEvent) {
		fmt.Fprintf(out, " %-5d  %-15s  %-8s  %-16s  %s\n", ev.GetHop(), ev.GetStage(), ev.GetBranch(), strings.TrimPrefix(ev.GetKind().String(), "EVENT_KIND_"), researchOutcome(ev))
	})
	if err != nil {
		return nil, err
	}
	got, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: job.GetRunId()})
	if err != nil {
		return nil, err
	}
	run := &ResearchRun{Job: got.GetJob(), Events: evs}
	PrintBranches(out, run.Job)
	for _, c := range run.Job.GetChildren() {
		cj, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: c.GetRunId()})
		if err != nil {
			return nil, err
		}
		run.Child = cj.GetJob()
		fmt.Fprintf(out, "\nsub-job %s: run %s of pipeline %s, %s after %d hops on the parent's wallet; returned %s (%s)\n",
			c.GetStage(), c.GetRunId(), c.GetPipeline(), strings.TrimPrefix(c.GetState().String(), "JOB_STATE_"), c.GetHops(),
			c.GetArtifact().GetSchemaVersion(), c.GetArtifact().GetUri())
	}
	PrintSummary(out, run.Job)
	return run, nil
}

// PrintBranches prints a run's branches side by side: each one's stage, status, hops and
// its start and end, relative to the first branch's start.
func PrintBranches(out io.Writer, job *handoffv1.Job) {
	if len(job.GetBranches()) == 0 {
		return
	}
	t0 := job.GetBranches()[0].GetStartedAt().AsTime()
	for _, b := range job.GetBranches() {
		if s := b.GetStartedAt().AsTime(); s.Before(t0) {
			t0 = s
		}
	}
	fmt.Fprintf(out, "\nbranches of %s, side by side (times from the fan-out's start):\n", job.GetBranches()[0].GetGroup())
	fmt.Fprintf(out, " %-8s  %-15s  %-10s  %4s  %9s  %9s\n", "branch", "stage", "status", "hops", "started", "ended")
	for _, b := range job.GetBranches() {
		fmt.Fprintf(out, " %-8s  %-15s  %-10s  %4d  %9s  %9s\n", b.GetBranch(), b.GetStage(), strings.TrimPrefix(b.GetStatus().String(), "BRANCH_STATUS_"), b.GetHops(),
			b.GetStartedAt().AsTime().Sub(t0).Round(time.Microsecond), b.GetEndedAt().AsTime().Sub(t0).Round(time.Microsecond))
	}
}

// Overlap reports whether every two branches of job ran at overlapping times.
func Overlap(job *handoffv1.Job) bool {
	bs := job.GetBranches()
	for i := range bs {
		for j := i + 1; j < len(bs); j++ {
			a, b := bs[i], bs[j]
			if !a.GetStartedAt().AsTime().Before(b.GetEndedAt().AsTime()) || !b.GetStartedAt().AsTime().Before(a.GetEndedAt().AsTime()) {
				return false
			}
		}
	}
	return len(bs) > 1
}

func researchOutcome(ev *handoffv1.JobEvent) string {
	switch ev.GetKind() {
	case handoffv1.EventKind_EVENT_KIND_ACK:
		return strings.TrimPrefix(ev.GetAck().GetStatus().String(), "ACK_STATUS_")
	case handoffv1.EventKind_EVENT_KIND_STAGE_RESULT:
		var vs []string
		for _, a := range ev.GetResult().GetArtifacts() {
			vs = append(vs, a.GetSchemaVersion())
		}
		return fmt.Sprintf("%s (spent $%.6f)", strings.Join(vs, ", "), float64(ev.GetResult().GetSpentUsdMicros())/1e6)
	case handoffv1.EventKind_EVENT_KIND_VERDICT:
		return "verdict " + strings.TrimPrefix(ev.GetEvaluator().GetLastVerdict().String(), "VERDICT_")
	case handoffv1.EventKind_EVENT_KIND_RECEIPT:
		return fmt.Sprintf("receipt %s key %s", ev.GetReceipt().GetExternalId(), ev.GetReceipt().GetIdempotencyKey())
	case handoffv1.EventKind_EVENT_KIND_SUBJOB_STARTED, handoffv1.EventKind_EVENT_KIND_SUBJOB_ENDED:
		return "run " + ev.GetSubRunId()
	case handoffv1.EventKind_EVENT_KIND_ESCALATED, handoffv1.EventKind_EVENT_KIND_FAILED:
		return ev.GetEscalation().GetCause().String() + " " + ev.GetEscalation().GetDetail()
	}
	return ""
}
