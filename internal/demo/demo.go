// Package demo runs the sample support ticket through a running platform and prints the
// hop timeline: it is `handoff demo`, kept out of cmd/ so tests can run it.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/traceparent"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// The sample ticket's job, as the source material's triage example has it.
const (
	JobID    = "tkt_18422"
	Pipeline = "support-ticket"
	Goal     = "Draft internal triage summary; do not send to customer"
)

// Constraints of the sample job.
var Constraints = []string{"no refund promises", "cite help center or no_match"}

// Result is what a demo run produced.
type Result struct {
	First, Second *handoffv1.Job
	// Events of the first and second run, in order.
	FirstEvents, SecondEvents []*handoffv1.JobEvent
}

// Run stores the sample ticket as the job's input artifact, submits it, prints the first
// run's timeline, then submits the same job again and prints the second run, whose stages
// answer DUPLICATE and whose write returns the first receipt.
func Run(ctx context.Context, out io.Writer, cc grpc.ClientConnInterface, arts artifact.Store) (*Result, error) {
	client := handoffv1.NewCoordinatorServiceClient(cc)
	input, err := arts.Put(ctx, artifact.Ref{JobID: JobID, Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
	if err != nil {
		return nil, fmt.Errorf("store the sample ticket: %w", err)
	}
	submit := func(requestID string) (*handoffv1.Job, []*handoffv1.JobEvent, error) {
		resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
			RequestId:   requestID,
			JobId:       JobID,
			Pipeline:    Pipeline,
			Goal:        Goal,
			Constraints: Constraints,
			Budget:      &handoffv1.Budget{UsdRemainingMicros: 1_200_000},
			Inputs:      []*handoffv1.Artifact{input},
			MemoryRefs:  []string{"customer_id:cus_9"},
		})
		if err != nil {
			return nil, nil, fmt.Errorf("submit: %w", err)
		}
		job := resp.GetJob()
		fmt.Fprintf(out, "\nrun %s  job %s  pipeline %s  trace %s\n", job.GetRunId(), job.GetJobId(), job.GetPipeline(), traceparent.TraceID(job.GetTraceparent()))
		tl := NewTimeline(out)
		tl.Header()
		evs, err := Watch(ctx, client, job.GetRunId(), tl.Print)
		if err != nil {
			return nil, nil, err
		}
		got, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: job.GetRunId()})
		if err != nil {
			return nil, nil, err
		}
		return got.GetJob(), evs, nil
	}

	fmt.Fprintf(out, "handoff demo: ticket %s, goal %q\n", JobID, Goal)
	res := &Result{}
	if res.First, res.FirstEvents, err = submit("demo-first"); err != nil {
		return nil, err
	}
	PrintSummary(out, res.First)
	fmt.Fprintf(out, "\nsubmitting job %s again (a new request): every stage is a DUPLICATE, the write returns the first receipt\n", JobID)
	if res.Second, res.SecondEvents, err = submit("demo-again"); err != nil {
		return nil, err
	}
	PrintSummary(out, res.Second)
	return res, nil
}

// Watch streams a run's events until it ends, calling each for every event.
func Watch(ctx context.Context, client handoffv1.CoordinatorServiceClient, runID string, each func(*handoffv1.JobEvent)) ([]*handoffv1.JobEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stream, err := client.WatchJob(ctx, &handoffv1.WatchJobRequest{RunId: runID})
	if err != nil {
		return nil, err
	}
	var evs []*handoffv1.JobEvent
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, fmt.Errorf("watch %s: %w", runID, err)
		}
		evs = append(evs, msg.GetEvent())
		if each != nil {
			each(msg.GetEvent())
		}
	}
}

// Money formats micro-USD as dollars.
func Money(micros int64) string { return fmt.Sprintf("$%d.%06d", micros/1_000_000, micros%1_000_000) }

// WalletLegend explains the wallet column under the header.
const WalletLegend = "      (wallet left after the hop: money, r = judge revisions left, h = hops left; $1.198500 r2 h11 is $1.1985, 2 revisions, 11 hops)"

func wallet(b *handoffv1.Budget) string {
	return fmt.Sprintf("%s r%d h%d", Money(b.GetUsdRemainingMicros()), b.GetRevisionsRemaining(), b.GetHopsRemaining())
}

// Timeline prints a run's events as one line per hop outcome: stage result, verdict,
// receipt, rejection, ending. Package-sent events are folded into the line of their ack.
type Timeline struct {
	out     io.Writer
	lastAck string
	// sent is the contract version of the hop's package when it was not handoff.v1 (the
	// stage's runner declares a newer one): shown on the hop's line.
	sent string
	// routes adds a route column: the move the rail made after each hop.
	routes bool
}

// NewTimeline prints to out.
func NewTimeline(out io.Writer) *Timeline { return &Timeline{out: out} }

// NewRouteTimeline prints to out with a route column (for pipelines with routes): on each
// hop line the move the rail made after it, as "route -> stage" ("billing ->
// billing-retrieve"), or the rail's own move ("next", "pass", "revise", "reroute",
// "operator") for a stage that chose none; "-" when the hop moved the run nowhere.
func NewRouteTimeline(out io.Writer) *Timeline { return &Timeline{out: out, routes: true} }

// Header prints the column names.
func (t *Timeline) Header() {
	defer fmt.Fprintln(t.out, WalletLegend)
	if t.routes {
		fmt.Fprintf(t.out, "%4s  %-18s %-10s %-32s %-56s %-22s %s\n", "hop", "stage", "ack", "route", "outcome", "wallet left", "trace id")
		return
	}
	fmt.Fprintf(t.out, "%4s  %-10s %-10s %-58s %-22s %s\n", "hop", "stage", "ack", "outcome", "wallet left", "trace id")
}

func (t *Timeline) line(ev *handoffv1.JobEvent, ack, outcome string) {
	if t.sent != "" && ack != "" {
		outcome = "[" + t.sent + "] " + outcome
	}
	if t.routes {
		route := ""
		if ev.GetKind() != handoffv1.EventKind_EVENT_KIND_ESCALATED && ev.GetKind() != handoffv1.EventKind_EVENT_KIND_FAILED {
			route = RouteText(ev.GetTransfer())
		}
		fmt.Fprintf(t.out, "%4d  %-18s %-10s %-32s %-56s %-22s %s\n", ev.GetHop(), ev.GetStage(), ack, clip(route, 32), clip(outcome, 56), wallet(ev.GetWallet()), traceparent.TraceID(ev.GetTraceparent()))
		return
	}
	fmt.Fprintf(t.out, "%4d  %-10s %-10s %-58s %-22s %s\n", ev.GetHop(), ev.GetStage(), ack, clip(outcome, 58), wallet(ev.GetWallet()), traceparent.TraceID(ev.GetTraceparent()))
}

// RouteText renders a move: "billing -> billing-retrieve" for a route, "revise -> draft" for
// a move of the rail's own (the move's name), "-" for none.
func RouteText(tr *handoffv1.Transfer) string {
	if tr == nil {
		return "-"
	}
	how := strings.ToLower(strings.TrimPrefix(tr.GetMove().String(), "MOVE_"))
	if r := tr.GetRoute(); r != nil {
		how = r.GetName()
	}
	return how + " -> " + tr.GetToStage()
}

// Print prints one event (or nothing, for events folded into others).
func (t *Timeline) Print(ev *handoffv1.JobEvent) {
	switch ev.GetKind() {
	case handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT:
		t.sent = ""
		if v := ev.GetSchema(); v != "" && v != contract.V1 {
			t.sent = v
		}
	case handoffv1.EventKind_EVENT_KIND_ACK:
		t.lastAck = strings.TrimPrefix(ev.GetAck().GetStatus().String(), "ACK_STATUS_")
		if strings.HasPrefix(t.lastAck, "REJECTED") {
			var rs []string
			for _, r := range ev.GetAck().GetReasons() {
				rs = append(rs, r.GetField()+": "+r.GetRule())
			}
			t.line(ev, t.lastAck, strings.Join(rs, "; "))
		}
	case handoffv1.EventKind_EVENT_KIND_STAGE_RESULT:
		r := ev.GetResult()
		if r.GetEvaluator() != nil {
			return // the verdict line says it
		}
		var types []string
		for _, a := range r.GetArtifacts() {
			types = append(types, a.GetSchemaVersion())
		}
		outcome := fmt.Sprintf("%s (spent %s)", strings.Join(types, ", "), Money(r.GetSpentUsdMicros()))
		if r.GetStatus() == handoffv1.StageStatus_STAGE_STATUS_FAILED {
			outcome = "FAILED: " + r.GetError()
		}
		t.line(ev, t.lastAck, outcome)
	case handoffv1.EventKind_EVENT_KIND_VERDICT:
		e := ev.GetEvaluator()
		var codes []string
		for _, f := range e.GetFailures() {
			codes = append(codes, f.GetCode())
		}
		verdict := strings.TrimPrefix(e.GetLastVerdict().String(), "VERDICT_")
		if len(codes) > 0 {
			verdict += " " + strings.Join(codes, ",")
		}
		t.line(ev, t.lastAck, "verdict "+verdict)
	case handoffv1.EventKind_EVENT_KIND_RECEIPT:
		r := ev.GetReceipt()
		t.line(ev, t.lastAck, fmt.Sprintf("receipt %s key %s", r.GetExternalId(), r.GetIdempotencyKey()))
	case handoffv1.EventKind_EVENT_KIND_ESCALATED:
		e := ev.GetEscalation()
		t.line(ev, "", fmt.Sprintf("ESCALATED %s -> %s", strings.TrimPrefix(e.GetCause().String(), "ESCALATION_CAUSE_"), e.GetRoute()))
	case handoffv1.EventKind_EVENT_KIND_FAILED:
		t.line(ev, "", "FAILED: "+ev.GetEscalation().GetDetail())
	}
}

// PrintSummary prints how a run ended.
func PrintSummary(out io.Writer, job *handoffv1.Job) {
	fmt.Fprintf(out, "=> %s after %d hops (%d revision), spent %s of the wallet, %s left\n",
		strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"), job.GetHops(), job.GetRevisions(), Money(job.GetSpentUsdMicros()), Money(job.GetWallet().GetUsdRemainingMicros()))
	if r := job.GetReceipt(); r != nil {
		fmt.Fprintf(out, "   receipt: %s on target %s, idempotency key %s\n", r.GetExternalId(), r.GetTarget(), r.GetIdempotencyKey())
	}
	if e := job.GetEscalation(); e != nil {
		fmt.Fprintf(out, "   stopped at %s: %s\n", e.GetStage(), e.GetDetail())
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
