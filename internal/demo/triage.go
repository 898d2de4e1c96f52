package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/traceparent"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// TriagePipeline is the shipped pipeline with routes.
const TriagePipeline = "support-triage"

// TriageTickets are the sample tickets `handoff demo --pipeline support-triage` runs, in
// order: one for each of intake's routes.
var TriageTickets = []string{support.TopicBilling, support.TopicTechnical, support.TopicUnclear}

// TriageRun is one ticket's run through support-triage.
type TriageRun struct {
	Ticket string // the sample ticket's name (its topic)
	Job    *handoffv1.Job
	Events []*handoffv1.JobEvent
}

// RunTriage submits each of TriageTickets to support-triage, one job per ticket, and prints
// each run's timeline with the route the rail took after every hop.
func RunTriage(ctx context.Context, out io.Writer, cc grpc.ClientConnInterface, arts artifact.Store) ([]TriageRun, error) {
	client := handoffv1.NewCoordinatorServiceClient(cc)
	fmt.Fprintf(out, "handoff demo: pipeline %s, one ticket for each of intake's routes (%s)\n", TriagePipeline, strings.Join(TriageTickets, ", "))
	var runs []TriageRun
	for _, name := range TriageTickets {
		data, err := support.Ticket(name)
		if err != nil {
			return nil, err
		}
		var t support.RawTicket
		if err := json.Unmarshal(data, &t); err != nil {
			return nil, fmt.Errorf("sample ticket %s: %w", name, err)
		}
		_, num, _ := strings.Cut(t.TicketID, "-") // T-1042 is job tkt_1042
		jobID := "tkt_" + num
		input, err := arts.Put(ctx, artifact.Ref{JobID: jobID, Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, data)
		if err != nil {
			return nil, fmt.Errorf("store the %s ticket: %w", name, err)
		}
		resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
			RequestId:   "demo-" + name,
			JobId:       jobID,
			Pipeline:    TriagePipeline,
			Goal:        Goal,
			Constraints: Constraints,
			Budget:      &handoffv1.Budget{UsdRemainingMicros: 1_200_000},
			Inputs:      []*handoffv1.Artifact{input},
			MemoryRefs:  []string{"customer_id:" + t.CustomerID},
		})
		if err != nil {
			return nil, fmt.Errorf("submit the %s ticket: %w", name, err)
		}
		job := resp.GetJob()
		fmt.Fprintf(out, "\nticket %s (%s): %q\n", t.TicketID, name, t.Subject)
		fmt.Fprintf(out, "run %s  job %s  pipeline %s  trace %s\n", job.GetRunId(), job.GetJobId(), job.GetPipeline(), traceparent.TraceID(job.GetTraceparent()))
		tl := NewRouteTimeline(out)
		tl.Header()
		evs, err := Watch(ctx, client, job.GetRunId(), tl.Print)
		if err != nil {
			return nil, err
		}
		got, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: job.GetRunId()})
		if err != nil {
			return nil, err
		}
		PrintSummary(out, got.GetJob())
		runs = append(runs, TriageRun{Ticket: name, Job: got.GetJob(), Events: evs})
	}
	return runs, nil
}
