package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/pipelines"
)

// loopYAML: two stages that may hand a job to each other, a route to end (no write is owed:
// no writeback stage), and a rejected_role fallback.
const loopYAML = `
name: loop
max_hops: 20
max_bounces: 2
escalation: {route: humans}
tools: []
stages:
  - name: a
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    criteria: [a]
    rejected_role: a-backup
    routes:
      - {name: to_b, description: "b owns it", to: b}
      - {name: done, description: "nothing more to do", to: end}
  - name: b
    input: note.v1
    output: {type: note2, schema_version: note2.v1}
    criteria: [b]
    routes:
      - {name: to_a, description: "a owns it", to: a}
  - name: a-backup
    agent: a
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    criteria: [a]
    next: b
`

func mustPipeline(t *testing.T, name string, data []byte) *pipeline.Pipeline {
	t.Helper()
	p, problems, err := pipeline.Parse(name, data)
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("%s: %v %v", name, err, problems)
	}
	return p
}

func shipped(t *testing.T, file string) *pipeline.Pipeline {
	t.Helper()
	p, err := pipeline.LoadFS(pipelines.FS, file)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Shorthands for the table.
var (
	accepted = &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED}
	pass     = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: 1}
	fail     = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1, Failures: []*handoffv1.Failure{{Code: "citation_missing"}}}
	summary  = &handoffv1.Artifact{Type: "summary_md", SchemaVersion: "summary_md.v1", Uri: "file:///a/summary.md"}
)

func done(route string) outcome {
	res := &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED}
	if route != "" {
		res.Route = &handoffv1.RouteChoice{Name: route, Reason: "because"}
	}
	return outcome{Sent: true, Ack: accepted, Result: res}
}

func verdict(ev *handoffv1.Evaluator) outcome {
	return outcome{Sent: true, Ack: accepted, Result: &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED, Evaluator: ev}}
}

func acked(s handoffv1.AckStatus) outcome {
	return outcome{Sent: true, Ack: &handoffv1.Ack{Status: s, Reasons: []*handoffv1.Reason{{Field: "f", Rule: "r"}}}}
}

func tr(from, to string, how handoffv1.Move) *handoffv1.Transfer {
	return &handoffv1.Transfer{FromStage: from, ToStage: to, Move: how}
}

// bounced is the transfers of a job handed a -> b -> a ... n times.
func bounced(n int) []*handoffv1.Transfer {
	var out []*handoffv1.Transfer
	from, to := "a", "b"
	for range n {
		out = append(out, tr(from, to, handoffv1.Move_MOVE_ROUTE))
		from, to = to, from
	}
	return out
}

// TestTransitions is the rail's rules, one row per rule: next by route, by next: and by
// file order, revise on FAIL with revisions left, revisions exhausted, the hop cap, ping-pong,
// the empty wallet, the writeback gate, rejected_role's one reroute, and each escalation cause.
func TestTransitions(t *testing.T) {
	triage := shipped(t, "support-triage.yaml")
	ticket := shipped(t, "support-ticket.yaml")
	loop := mustPipeline(t, "loop.yaml", []byte(loopYAML))
	// The loop with a writeback stage, built in code past lint (which refuses a route to end
	// before the write): the rail still refuses the move.
	owing := *loop
	owing.Stages = append(slices.Clone(loop.Stages), pipeline.Stage{Name: "writeback", Kind: pipeline.KindWriteback, Input: "note.v1",
		Writer: &pipeline.Writer{System: "crm", Target: "ledger"}, Output: pipeline.Output{Type: "crm_receipt", SchemaVersion: "crm_receipt.v1"}})

	// The ticket pipeline with a stage after its writeback: a job that ends there by file
	// order without having been written (reached by a route or a fallback) still owes it.
	ending := *ticket
	ending.Stages = append(slices.Clone(ticket.Stages), pipeline.Stage{Name: "note", Kind: pipeline.KindAgent, Agent: "note", Input: "raw_ticket.v1",
		Output: pipeline.Output{Type: "note", SchemaVersion: "note.v1"}})

	type want struct {
		action   action
		cause    handoffv1.EscalationCause
		to       string // Transfer.to_stage, "" for no transfer
		move     handoffv1.Move
		visit    uint32
		revision bool   // takes a revision
		detail   string // part of Detail
		artifact bool   // a writeback hop with its artifact
	}
	const (
		send     = actSend
		mv       = actMove
		complete = actComplete
		esc      = actEscalate
		failed   = actFail
	)
	E := func(c handoffv1.EscalationCause, detail string) want {
		return want{action: esc, cause: c, detail: detail}
	}
	tests := []struct {
		name  string
		p     *pipeline.Pipeline
		stage string
		job   func(j *handoffv1.Job) // adjusts the run: wallet, evaluator, transfers
		saved *handoffv1.Budget      // the wallet the run was saved with (a repeated step)
		out   outcome
		want  want
	}{
		// Before the hop.
		{name: "send: wallet and hops left", p: ticket, stage: "draft", out: outcome{}, want: want{action: send}},
		{name: "hop cap", p: ticket, stage: "draft", job: func(j *handoffv1.Job) { j.Wallet.HopsRemaining = 0; j.Hops = 12 },
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP, "hop cap reached after 12 hops")},
		{name: "empty wallet", p: ticket, stage: "draft", job: func(j *handoffv1.Job) { j.Wallet.UsdRemainingMicros = 0 },
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY, "wallet is empty")},
		{name: "hop cap: a repeated step's hop was paid", p: ticket, stage: "draft", job: func(j *handoffv1.Job) { j.Wallet.HopsRemaining = 0 },
			saved: &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 1, RevisionsRemaining: 2}, want: want{action: send}},
		{name: "writeback gate: no PASS", p: ticket, stage: "writeback", job: func(j *handoffv1.Job) { j.Evaluator = fail; j.Artifacts = []*handoffv1.Artifact{summary} },
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED, "last verdict is VERDICT_FAIL, not PASS")},
		{name: "writeback gate: nothing to write", p: ticket, stage: "writeback", job: func(j *handoffv1.Job) { j.Evaluator = pass },
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED, `no artifact with schema version "summary_md.v1"`)},
		{name: "writeback gate: PASS sends the artifact", p: ticket, stage: "writeback", job: func(j *handoffv1.Job) { j.Evaluator = pass; j.Artifacts = []*handoffv1.Artifact{summary} },
			want: want{action: send, artifact: true}},
		{name: "a person's approve overrides the wallet, not the gate", p: ticket, stage: "writeback",
			job: func(j *handoffv1.Job) {
				j.Wallet.HopsRemaining = 0
				j.Evaluator = pass
				j.Artifacts = []*handoffv1.Artifact{summary}
			},
			out: outcome{Override: true}, want: want{action: send, artifact: true}},
		{name: "pipeline no longer loaded", p: nil, stage: "draft", want: want{action: failed, detail: `pipeline "support-ticket" is no longer loaded`}},
		{name: "stage not in the pipeline", p: ticket, stage: "polish", want: want{action: failed, detail: `stage "polish" is not in pipeline support-ticket`}},

		// After an agent hop: moves.
		{name: "next by file order", p: ticket, stage: "intake", out: done(""), want: want{action: mv, to: "retrieve", move: handoffv1.Move_MOVE_NEXT}},
		{name: "next by next:", p: triage, stage: "billing-draft", out: done(""), want: want{action: mv, to: "judge", move: handoffv1.Move_MOVE_NEXT}},
		{name: "next by route", p: triage, stage: "intake", out: done("technical"), want: want{action: mv, to: "technical-retrieve", move: handoffv1.Move_MOVE_ROUTE}},
		{name: "no_hit routes to the note", p: triage, stage: "billing-retrieve", out: done("no_hit"), want: want{action: mv, to: "no-match-note", move: handoffv1.Move_MOVE_ROUTE}},
		{name: "a DUPLICATE's result moves like the first", p: triage, stage: "intake",
			out:  outcome{Sent: true, Ack: &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_DUPLICATE}, Result: done("billing").Result},
			want: want{action: mv, to: "billing-retrieve", move: handoffv1.Move_MOVE_ROUTE}},
		{name: "PASS moves on", p: ticket, stage: "judge", out: verdict(pass), want: want{action: mv, to: "writeback", move: handoffv1.Move_MOVE_PASS}},
		{name: "revise on FAIL with revisions left", p: ticket, stage: "judge", out: verdict(fail),
			want: want{action: mv, to: "draft", move: handoffv1.Move_MOVE_REVISE, revision: true}},
		{name: "revise: back to the drafter the work came from", p: triage, stage: "judge",
			job: func(j *handoffv1.Job) {
				j.Transfers = []*handoffv1.Transfer{tr("intake", "technical-retrieve", handoffv1.Move_MOVE_ROUTE), tr("technical-retrieve", "technical-draft", handoffv1.Move_MOVE_ROUTE), tr("technical-draft", "judge", handoffv1.Move_MOVE_NEXT)}
			},
			out: verdict(fail), want: want{action: mv, to: "technical-draft", move: handoffv1.Move_MOVE_REVISE, revision: true}},
		{name: "revise: a repeated step's revision was taken", p: ticket, stage: "judge", job: func(j *handoffv1.Job) { j.Wallet.RevisionsRemaining = 0 },
			saved: &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 10, RevisionsRemaining: 1}, out: verdict(fail),
			want: want{action: mv, to: "draft", move: handoffv1.Move_MOVE_REVISE}},
		{name: "revisions exhausted", p: ticket, stage: "judge", job: func(j *handoffv1.Job) { j.Wallet.RevisionsRemaining = 0 }, out: verdict(fail),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED, "no revisions are left")},
		{name: "the last stage completes", p: ticket, stage: "writeback", out: outcome{Sent: true, Receipt: &handoffv1.Receipt{}},
			want: want{action: complete, to: "end", move: handoffv1.Move_MOVE_NEXT}},
		{name: "route to end where no write is owed", p: loop, stage: "a", out: done("done"), want: want{action: complete, to: "end", move: handoffv1.Move_MOVE_ROUTE}},
		{name: "a route back to a stage is its next visit", p: loop, stage: "b", job: func(j *handoffv1.Job) { j.Transfers = bounced(1) }, out: done("to_a"),
			want: want{action: mv, to: "a", move: handoffv1.Move_MOVE_ROUTE, visit: 1}},
		{name: "rejected_role reroutes once to the fallback", p: loop, stage: "a", out: acked(handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE),
			want: want{action: mv, to: "a-backup", move: handoffv1.Move_MOVE_REROUTE}},

		// After an agent hop: escalations, one per cause.
		{name: "REJECTED_ROLE: no fallback", p: ticket, stage: "retrieve", out: acked(handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_ROLE, "declares no rejected_role fallback")},
		{name: "REJECTED_ROLE: the fallback rejects too", p: loop, stage: "a-backup", job: func(j *handoffv1.Job) {
			j.Transfers = []*handoffv1.Transfer{tr("a", "a-backup", handoffv1.Move_MOVE_REROUTE)}
		},
			out: acked(handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE), want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_ROLE, "rerouted once already")},
		{name: "REJECTED_SCHEMA", p: ticket, stage: "draft", out: acked(handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA, "answered ACK_STATUS_REJECTED_SCHEMA")},
		{name: "REJECTED_BUDGET", p: ticket, stage: "draft", out: acked(handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_BUDGET, "answered ACK_STATUS_REJECTED_BUDGET")},
		{name: "STAGE_FAILED: the stage failed", p: ticket, stage: "draft",
			out:  outcome{Sent: true, Ack: accepted, Result: &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_FAILED, Error: "model timed out"}},
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, "failed: model timed out")},
		{name: "STAGE_FAILED: an invalid result", p: ticket, stage: "draft", out: outcome{Sent: true, Ack: accepted, Invalid: []*handoffv1.Reason{{Field: "artifacts[0].uri"}}},
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, "returned an invalid result")},
		{name: "STAGE_FAILED: a judge without a verdict", p: ticket, stage: "judge", out: done(""),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, "returned no verdict")},
		{name: "ROUTE_UNDECLARED: a route the stage does not declare", p: triage, stage: "intake", out: done("shipping"),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, `chose route "shipping", which it does not declare (its routes: billing, technical, unclear)`)},
		{name: "ROUTE_UNDECLARED: a routed stage chose none", p: triage, stage: "intake", out: done(""),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, "has routes (billing, technical, unclear) and chose none")},
		{name: "ROUTE_UNDECLARED: a stage without routes chose one", p: ticket, stage: "retrieve", out: done("no_hit"),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, `chose route "no_hit" but declares no routes`)},
		{name: "ROUTE_UNDECLARED: a judge chose a route", p: ticket, stage: "judge",
			out:  outcome{Sent: true, Ack: accepted, Result: &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED, Evaluator: pass, Route: &handoffv1.RouteChoice{Name: "writeback"}}},
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, "a judge's verdict is its only route")},
		{name: "ROUTE_UNDECLARED: a route to end while the write is owed", p: &owing, stage: "a", out: done("done"),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, "which ends the job, but the job still owes its write")},
		{name: "a route to end once the write is made", p: &owing, stage: "a", job: func(j *handoffv1.Job) { j.Receipt = &handoffv1.Receipt{} }, out: done("done"),
			want: want{action: complete, to: "end", move: handoffv1.Move_MOVE_ROUTE}},
		{name: "ROUTED: a declared route to escalate", p: triage, stage: "intake", out: done("unclear"),
			want: want{action: esc, cause: handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTED, to: "escalate", move: handoffv1.Move_MOVE_ROUTE, detail: "chose route unclear, which hands the job to a person: because"}},
		{name: "PING_PONG past max_bounces", p: loop, stage: "b", job: func(j *handoffv1.Job) { j.Transfers = bounced(3) }, out: done("to_a"),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_PING_PONG, "ping-pong between stages a and b: they handed the job straight back to each other 3 times, and max_bounces is 2")},
		{name: "ping-pong: max_bounces bounces still move", p: loop, stage: "a", job: func(j *handoffv1.Job) { j.Transfers = bounced(2) }, out: done("to_b"),
			want: want{action: mv, to: "b", move: handoffv1.Move_MOVE_ROUTE, visit: 1}},
		{name: "ping-pong: a one-way repeat is no bounce", p: loop, stage: "b",
			job: func(j *handoffv1.Job) {
				for range 3 {
					j.Transfers = append(j.Transfers, tr("a", "b", handoffv1.Move_MOVE_ROUTE), tr("b", "a-backup", handoffv1.Move_MOVE_NEXT), tr("a-backup", "b", handoffv1.Move_MOVE_NEXT))
				}
			},
			out: done("to_a"), want: want{action: mv, to: "a", move: handoffv1.Move_MOVE_ROUTE, visit: 1}},
		{name: "ping-pong: a person's return starts the count again", p: loop, stage: "b",
			job: func(j *handoffv1.Job) {
				j.Transfers = append(bounced(3), tr("b", "a", handoffv1.Move_MOVE_OPERATOR), tr("a", "b", handoffv1.Move_MOVE_ROUTE))
			},
			out: done("to_a"), want: want{action: mv, to: "a", move: handoffv1.Move_MOVE_ROUTE, visit: 1}},
		{name: "ROUTE_UNDECLARED: the last stage by file order while the write is owed", p: &ending, stage: "note", out: done(""),
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, "stage note is the last in the pipeline and moves nowhere, but the job still owes its write")},
		{name: "ping-pong: the critique loop does not count", p: ticket, stage: "judge",
			job: func(j *handoffv1.Job) {
				for range 5 {
					j.Transfers = append(j.Transfers, tr("draft", "judge", handoffv1.Move_MOVE_NEXT), tr("judge", "draft", handoffv1.Move_MOVE_REVISE))
				}
			},
			out: verdict(fail), want: want{action: mv, to: "draft", move: handoffv1.Move_MOVE_REVISE, revision: true}},
		{name: "fail: agent runner unreachable", p: ticket, stage: "draft", out: outcome{Sent: true, Err: errors.New("connection refused")},
			want: want{action: failed, detail: "stage draft: agent runner unreachable: connection refused"}},

		// After a writeback hop.
		{name: "WRITE_REFUSED: the writeback refused", p: ticket, stage: "writeback", out: outcome{Sent: true, Err: status.Error(codes.FailedPrecondition, "no PASS")},
			want: E(handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED, "writeback writeback: no PASS")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := &handoffv1.Job{
				RunId: "run_1", JobId: "tkt_1", Pipeline: "support-ticket", Stage: tt.stage, State: handoffv1.JobState_JOB_STATE_RUNNING,
				Wallet: &handoffv1.Budget{UsdRemainingMicros: 1_000_000, RevisionsRemaining: 2, HopsRemaining: 10},
			}
			if tt.p != nil {
				job.Pipeline = tt.p.Name
			}
			if tt.job != nil {
				tt.job(job)
			}
			got := next(tt.p, job, stepWallet{saved: tt.saved}, tt.out)
			w := tt.want
			if got.Action != w.action || got.Cause != w.cause || got.Revision != w.revision || !strings.Contains(got.Detail, w.detail) || (got.Artifact != nil) != w.artifact {
				t.Errorf("next = %s %s revision=%v artifact=%v %q\nwant   %s %s revision=%v artifact=%v %q", got.Action, got.Cause, got.Revision, got.Artifact != nil, got.Detail,
					w.action, w.cause, w.revision, w.artifact, w.detail)
			}
			if tt.want.to == "" {
				if got.Transfer != nil {
					t.Errorf("transfer %v, want none", got.Transfer)
				}
				return
			}
			tf := got.Transfer
			if tf.GetFromStage() != tt.stage || tf.GetToStage() != w.to || tf.GetMove() != w.move || tf.GetVisit() != w.visit || tf.GetHop() != job.GetHops() {
				t.Errorf("transfer %v; want %s -> %s by %s, visit %d", tf, tt.stage, w.to, w.move, w.visit)
			}
			if w.move == handoffv1.Move_MOVE_ROUTE && tf.GetRoute().GetName() == "" {
				t.Errorf("a route move without its route: %v", tf)
			}
		})
	}
}

// TestTransitionRevisionFallback: when the store has no revision to take after all, the
// driver ends the run as next said it would then.
func TestTransitionRevisionFallback(t *testing.T) {
	ticket := shipped(t, "support-ticket.yaml")
	job := &handoffv1.Job{Pipeline: ticket.Name, Stage: "judge", Wallet: &handoffv1.Budget{UsdRemainingMicros: 5, RevisionsRemaining: 1, HopsRemaining: 3}}
	got := next(ticket, job, stepWallet{}, verdict(fail))
	if !got.Revision || got.NoRevision == nil || got.NoRevision.Cause != handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED {
		t.Fatalf("next = %+v; want a revision with REVISIONS_EXHAUSTED as its fallback", got)
	}
}

// TestVisits: the visit of an arrival counts earlier arrivals at the stage within the
// current judge round and operator return; the first stage counts its submit.
func TestVisits(t *testing.T) {
	loop := mustPipeline(t, "loop.yaml", []byte(loopYAML))
	ticket := shipped(t, "support-ticket.yaml")
	for _, c := range []struct {
		p         *pipeline.Pipeline
		transfers []*handoffv1.Transfer
		stage     string
		want      uint32
	}{
		{loop, nil, "b", 0},
		{loop, nil, "a", 1}, // submitted at a
		{loop, bounced(1), "a", 1},
		{loop, bounced(2), "b", 1},
		{loop, bounced(3), "a", 2},
		{loop, append(bounced(3), tr("b", "a", handoffv1.Move_MOVE_OPERATOR)), "b", 0}, // a person's decision starts over
		{ticket, []*handoffv1.Transfer{tr("intake", "retrieve", handoffv1.Move_MOVE_NEXT), tr("retrieve", "draft", handoffv1.Move_MOVE_NEXT), tr("draft", "judge", handoffv1.Move_MOVE_NEXT)}, "draft", 1},
		{ticket, []*handoffv1.Transfer{tr("draft", "judge", handoffv1.Move_MOVE_NEXT), tr("judge", "draft", handoffv1.Move_MOVE_REVISE)}, "judge", 0}, // a new round
	} {
		job := &handoffv1.Job{Transfers: c.transfers}
		if got := visit(c.p, job, c.stage); got != c.want {
			t.Errorf("%s after %s: visit %d, want %d", c.stage, moves(c.transfers), got, c.want)
		}
	}
}

func moves(ts []*handoffv1.Transfer) string {
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%s->%s", t.GetFromStage(), t.GetToStage()))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// TestStepWallet: what a step pays, and what a repeated step does not pay again.
func TestStepWallet(t *testing.T) {
	cur := &handoffv1.Budget{UsdRemainingMicros: 90, HopsRemaining: 4, RevisionsRemaining: 1}
	fresh := stepWallet{}
	if d := fresh.hop(cur); d != (store.Debit{Hops: 1}) {
		t.Errorf("fresh hop = %+v", d)
	}
	if ok, take := fresh.revision(cur); !ok || !take {
		t.Errorf("fresh revision = %v, %v", ok, take)
	}
	if d := fresh.spend(-5); d != (store.Debit{}) {
		t.Errorf("negative spend debits %+v", d)
	}
	repeated := stepWallet{saved: &handoffv1.Budget{UsdRemainingMicros: 100, HopsRemaining: 5, RevisionsRemaining: 2}}
	if d := repeated.hop(cur); d != (store.Debit{}) {
		t.Errorf("repeated hop = %+v, want nothing (paid before the save failed)", d)
	}
	if ok, take := repeated.revision(cur); !ok || take {
		t.Errorf("repeated revision = %v, %v; want ok without taking another", ok, take)
	}
	if hop, usd, rev := repeated.paid(cur); !hop || !usd || !rev {
		t.Errorf("paid = %v %v %v", hop, usd, rev)
	}
	none := &handoffv1.Budget{UsdRemainingMicros: 90, HopsRemaining: 4}
	if ok, _ := fresh.revision(none); ok {
		t.Error("a revision with none left")
	}
}

// chooseVersion: the newest declared version the run can be written in.
func TestChooseVersion(t *testing.T) {
	for _, c := range []struct {
		accepts  []string
		deadline bool
		want     string
	}{
		{[]string{contract.V1, contract.V2}, true, contract.V2},
		{[]string{contract.V2}, true, contract.V2},
		{[]string{contract.V1, contract.V2}, false, contract.V1}, // v2 requires budget.deadline
		{[]string{contract.V1}, true, contract.V1},
		{nil, true, contract.V1}, // declares nothing: v1, and the runner's refusal escalates
	} {
		if got := chooseVersion(c.accepts, c.deadline); got != c.want {
			t.Errorf("chooseVersion(%v, deadline %v) = %s, want %s", c.accepts, c.deadline, got, c.want)
		}
	}
}

// The deadline: past it next sends no hop and escalates DEADLINE (a person's approve
// overrides it); a runner's REJECTED_BUDGET for the deadline escalates DEADLINE too, one for
// an empty wallet stays REJECTED_BUDGET.
func TestNextDeadline(t *testing.T) {
	p := mustPipeline(t, "loop.yaml", []byte(loopYAML))
	dl := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	job := &handoffv1.Job{Pipeline: "loop", Stage: "a", Deadline: timestamppb.New(dl),
		Wallet: &handoffv1.Budget{UsdRemainingMicros: 1000, HopsRemaining: 5, RevisionsRemaining: 1}}
	if tr := next(p, job, stepWallet{}, outcome{Now: dl.Add(-time.Second)}); tr.Action != actSend {
		t.Errorf("before the deadline: %s, want send", tr.Action)
	}
	tr := next(p, job, stepWallet{}, outcome{Now: dl})
	if tr.Action != actEscalate || tr.Cause != handoffv1.EscalationCause_ESCALATION_CAUSE_DEADLINE || !strings.Contains(tr.Detail, "2026-12-01T12:00:00Z") {
		t.Errorf("at the deadline: %+v, want escalate DEADLINE naming it", tr)
	}
	if tr := next(p, job, stepWallet{}, outcome{Now: dl.Add(time.Hour), Override: true}); tr.Action != actSend {
		t.Errorf("an approve past the deadline: %s, want send", tr.Action)
	}
	old := proto.CloneOf(job)
	old.Deadline = nil // a run from before deadlines
	if tr := next(p, old, stepWallet{}, outcome{Now: dl.Add(time.Hour)}); tr.Action != actSend {
		t.Errorf("a run without a deadline: %s, want send", tr.Action)
	}
	for rule, want := range map[string]handoffv1.EscalationCause{
		"budget.deadline": handoffv1.EscalationCause_ESCALATION_CAUSE_DEADLINE,
		"budget.empty":    handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_BUDGET,
	} {
		ack := &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, Reasons: []*handoffv1.Reason{{Field: "budget", Rule: rule}}}
		if tr := next(p, job, stepWallet{}, outcome{Sent: true, Ack: ack}); tr.Action != actEscalate || tr.Cause != want {
			t.Errorf("REJECTED_BUDGET %s: %+v, want escalate %s", rule, tr, want)
		}
	}
}

// TestNextBackoff: a hop's retries back off by doubling; a peer that is down is tried
// again at least every 500ms (its connection's reconnect backoff paces the dials), one
// that is up and asks for patience waits up to 2s.
func TestNextBackoff(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, c := range []struct {
		code codes.Code
		want []time.Duration // the pauses after 50ms, one per failed retry
	}{
		{codes.Unavailable, []time.Duration{ms(100), ms(200), ms(400), ms(500), ms(500)}},
		{codes.Aborted, []time.Duration{ms(100), ms(200), ms(400), ms(800), ms(1600), ms(2000), ms(2000)}},
		{codes.ResourceExhausted, []time.Duration{ms(100), ms(200), ms(400), ms(800), ms(1600), ms(2000)}},
		{codes.DeadlineExceeded, []time.Duration{ms(100), ms(200), ms(400), ms(800), ms(1600), ms(2000)}},
	} {
		b := ms(50)
		for i, want := range c.want {
			if b = nextBackoff(b, c.code); b != want {
				t.Errorf("%s: pause %d = %s, want %s", c.code, i+1, b, want)
			}
		}
	}
}
