package coordinator_test

import (
	"context"
	"slices"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// TestSupportTriage runs the shipped support-triage pipeline with the shipped agents over
// real gRPC: a billing and a technical ticket each go to their own desk and are written
// once, the one no article matches gets its no-match note written, and the unclear one is
// handed to a person by intake's route. The route taken is on GetJob (transfers) and on the
// WatchJob events of each hop.
func TestSupportTriage(t *testing.T) {
	st, client := startStack(t, stack.Config{})
	e := &env{st: st, client: client}
	ctx := context.Background()
	for _, tc := range []struct {
		ticket, jobID string
		state         handoffv1.JobState
		moves         []string
	}{
		{"billing", "tkt_b", handoffv1.JobState_JOB_STATE_COMPLETED, []string{
			"intake->billing-retrieve:ROUTE(billing)", "billing-retrieve->billing-draft:ROUTE(hit)", "billing-draft->judge:NEXT",
			"judge->billing-draft:REVISE", "billing-draft->judge:NEXT", "judge->writeback:PASS", "writeback->end:NEXT"}},
		{"technical", "tkt_t", handoffv1.JobState_JOB_STATE_COMPLETED, []string{
			"intake->technical-retrieve:ROUTE(technical)", "technical-retrieve->technical-draft:ROUTE(hit)", "technical-draft->judge:NEXT",
			"judge->technical-draft:REVISE", "technical-draft->judge:NEXT", "judge->writeback:PASS", "writeback->end:NEXT"}},
		{"no-match", "tkt_n", handoffv1.JobState_JOB_STATE_COMPLETED, []string{
			"intake->technical-retrieve:ROUTE(technical)", "technical-retrieve->no-match-note:ROUTE(no_hit)", "no-match-note->judge:NEXT", "judge->writeback:PASS", "writeback->end:NEXT"}},
		{"unclear", "tkt_u", handoffv1.JobState_JOB_STATE_ESCALATED, []string{"intake->escalate:ROUTE(unclear)"}},
	} {
		t.Run(tc.ticket, func(t *testing.T) {
			data, err := support.Ticket(tc.ticket)
			if err != nil {
				t.Fatal(err)
			}
			in, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: tc.jobID, Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, data)
			if err != nil {
				t.Fatal(err)
			}
			e.input = in
			job, evs := e.submit(t, "support-triage", tc.jobID, "", &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
			if job.GetState() != tc.state {
				t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
			}
			if got := moveList(job); !slices.Equal(got, tc.moves) {
				t.Fatalf("moves\n got %v\nwant %v", got, tc.moves)
			}
			// Every move is also on the event of the hop that made it (and a move that ends the
			// run on its last event too).
			var seen []string
			for _, ev := range evs {
				if tr := ev.GetTransfer(); tr != nil && ev.GetKind() != handoffv1.EventKind_EVENT_KIND_ESCALATED && ev.GetKind() != handoffv1.EventKind_EVENT_KIND_COMPLETED {
					seen = append(seen, tr.GetFromStage()+"->"+tr.GetToStage())
				}
			}
			if len(seen) != len(tc.moves) {
				t.Errorf("events carry moves %v; want one per move %v", seen, tc.moves)
			}
			if tc.state == handoffv1.JobState_JOB_STATE_ESCALATED {
				if esc := job.GetEscalation(); esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTED || esc.GetStage() != "intake" || esc.GetRoute() != "support-leads" {
					t.Errorf("escalation %v; want ROUTED at intake to support-leads", esc)
				}
				if job.GetReceipt() != nil {
					t.Errorf("an escalated ticket was written: %v", job.GetReceipt())
				}
			} else if job.GetReceipt().GetIdempotencyKey() != tc.jobID+":writeback:summary_md" {
				t.Errorf("receipt %v", job.GetReceipt())
			}
		})
	}
	if n := e.writes(t); n != 3 {
		t.Fatalf("%d writes, want 3 (billing, technical, no-match; the unclear ticket none)", n)
	}
}
