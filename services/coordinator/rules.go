package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/store"
)

// The rail's rules in one place. next is a pure function: from the pipeline, the run as it
// stands and what the hop's receiver answered, it says what happens next. It reads nothing
// and writes nothing; the driver (driver.go) sends, debits and saves what next decides.
//
// A step calls next twice: before the hop (outcome.Sent false: send it, or stop the run
// here) and after it (move on, revise, complete, escalate, fail).

// outcome is what the hop's receiver answered, as the rules need it.
type outcome struct {
	// Sent is false before the hop is sent.
	Sent bool
	// Override is a person's approve: its writeback hop is sent without the wallet checks.
	Override bool
	// Err is why the receiver could not be reached (an agent runner) or refused (the
	// writeback), past every retry.
	Err error
	// Ack is the agent runner's first answer.
	Ack *handoffv1.Ack
	// Result is the stage's valid result (a DUPLICATE's: its first one); nil when none.
	Result *handoffv1.StageResult
	// Invalid holds why the stage's result was not a valid StageResult.
	Invalid []*handoffv1.Reason
	// Receipt is the writeback's proof of the write.
	Receipt *handoffv1.Receipt
	// Now is the time the hop would be sent, for the run's deadline (before the hop). Zero:
	// the deadline is not checked (a person's approve overrides it, as it does the wallet).
	Now time.Time
}

// action is what the driver does with a transition.
type action int

const (
	// actSend: send the hop (for a writeback stage, Artifact is what to write).
	actSend action = iota
	// actMove: the run goes on at Transfer.to_stage.
	actMove
	// actComplete: the run ends COMPLETED.
	actComplete
	// actEscalate: the run ends ESCALATED with Cause, Detail and Reasons.
	actEscalate
	// actFail: the rail itself cannot go on; the run ends FAILED with Detail.
	actFail
)

func (a action) String() string {
	return [...]string{"send", "move", "complete", "escalate", "fail"}[a]
}

// transition is what next decides.
type transition struct {
	Action action
	// Transfer is the move made: for actMove, and for a route to escalate or end.
	Transfer *handoffv1.Transfer
	// Revision: take one revision off the wallet before the move (a judge's FAIL).
	Revision bool
	// NoRevision is the transition instead when the store has no revision left to take
	// after all (the run's copy of the wallet said it had).
	NoRevision *transition
	Cause      handoffv1.EscalationCause
	Detail     string
	Reasons    []*handoffv1.Reason
	// Artifact is what a writeback hop writes (actSend at a writeback stage).
	Artifact *handoffv1.Artifact
	// Stale: the move sends an identical revision back to its reviser (stale.go); the
	// evaluator gets the failure that says so.
	Stale bool
}

// stepWallet is one step's wallet arithmetic. The run's wallet (job.wallet) mirrors the
// store's after every debit; saved is the wallet as the run was last saved when the step
// starts from a run just loaded, nil when it starts from the run the previous step saved.
// Each debit is mirrored into the run when it is saved, so a wallet below saved was debited
// by a step whose save failed (or whose coordinator stopped), and this step repeats it: what
// that step paid (its hop, its revision; its spend the runner does not charge again) is not
// taken twice.
type stepWallet struct {
	saved *handoffv1.Budget
}

// paid says which parts of cur a repeated step already took: its hop, money, a revision.
// All false when the step repeats nothing.
func (w stepWallet) paid(cur *handoffv1.Budget) (hop, usd, revision bool) {
	if w.saved == nil {
		return false, false, false
	}
	return cur.GetHopsRemaining() < w.saved.GetHopsRemaining(),
		cur.GetUsdRemainingMicros() < w.saved.GetUsdRemainingMicros(),
		cur.GetRevisionsRemaining() < w.saved.GetRevisionsRemaining()
}

// hop is the debit of the rail paying a hop itself (a receiver that does not share its
// store, the writeback): one hop, none when the repeated step paid it.
func (w stepWallet) hop(cur *handoffv1.Budget) store.Debit {
	if hop, _, _ := w.paid(cur); hop {
		return store.Debit{}
	}
	return store.Debit{Hops: 1}
}

// spend is the debit of what a stage spent.
func (w stepWallet) spend(micros int64) store.Debit { return store.Debit{USDMicros: max(micros, 0)} }

// revision says whether a judge's FAIL can go back for revision, and whether that takes a
// revision off the wallet (not when the repeated step took it).
func (w stepWallet) revision(cur *handoffv1.Budget) (ok, take bool) {
	if _, _, taken := w.paid(cur); taken {
		return true, false
	}
	return cur.GetRevisionsRemaining() > 0, true
}

// next is the rail's rules for one step of run job through pipeline p (nil when the
// pipeline is no longer loaded). See the file comment.
func next(p *pipeline.Pipeline, job *handoffv1.Job, w stepWallet, out outcome) transition {
	if p == nil {
		return transition{Action: actFail, Detail: fmt.Sprintf("pipeline %q is no longer loaded", job.GetPipeline())}
	}
	st, _, ok := p.Stage(job.GetStage())
	if !ok {
		return transition{Action: actFail, Detail: fmt.Sprintf("stage %q is not in pipeline %s", job.GetStage(), p.Name)}
	}
	if !out.Sent {
		return before(p, st, job, w, out)
	}
	if st.IsWriteback() {
		if out.Err != nil {
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED, fmt.Sprintf("writeback %s: %v", st.Name, status.Convert(out.Err).Message()), nil)
		}
		// The write is made: its receipt is the outcome's, saved with the move.
		return onward(p, st, job, handoffv1.Move_MOVE_NEXT, false)
	}
	return afterAgent(p, st, job, w, out)
}

// before decides whether the hop to st is sent. The rail checks the wallet before it sends
// anything: an empty wallet or the hop cap ends the run here, gracefully, instead of in the
// middle of a stage; not when the repeated step emptied it, whose hop is a replay that costs
// nothing again (a hop the runner would charge, it refuses with REJECTED_BUDGET before any
// agent runs). A person's approve overrides the wallet; nothing overrides the writeback gate.
func before(p *pipeline.Pipeline, st *pipeline.Stage, job *handoffv1.Job, w stepWallet, out outcome) transition {
	hopPaid, usdPaid, _ := w.paid(job.GetWallet())
	if dl := job.GetDeadline(); dl != nil && !out.Override && !out.Now.IsZero() && !out.Now.Before(dl.AsTime()) {
		// Past the deadline no hop is sent, v1 or v2: a v1 package cannot carry the
		// deadline, so the rail checks it itself before every hop.
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_DEADLINE,
			fmt.Sprintf("the job's deadline %s passed before stage %s", dl.AsTime().UTC().Format(time.RFC3339), st.Name), nil)
	}
	switch {
	case out.Override || hopPaid || usdPaid:
	case job.GetWallet().GetHopsRemaining() == 0:
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP, fmt.Sprintf("hop cap reached after %d hops", job.GetHops()), nil)
	case job.GetWallet().GetUsdRemainingMicros() == 0:
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY, "the job's wallet is empty", nil)
	}
	if !st.IsWriteback() {
		return transition{Action: actSend}
	}
	// The writeback gate: only ever after a judge's PASS (a person's approve is one).
	if v := job.GetEvaluator().GetLastVerdict(); v != handoffv1.Verdict_VERDICT_PASS {
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED,
			fmt.Sprintf("writeback %s refused by the rail: last verdict is %s, not PASS", st.Name, v), nil)
	}
	art := latestArtifact(job.GetArtifacts(), st.Input)
	if art == nil {
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_WRITE_REFUSED,
			fmt.Sprintf("writeback %s: no artifact with schema version %q to write", st.Name, st.Input), nil)
	}
	return transition{Action: actSend, Artifact: art}
}

// afterAgent applies what an agent runner answered for stage st.
func afterAgent(p *pipeline.Pipeline, st *pipeline.Stage, job *handoffv1.Job, w stepWallet, out outcome) transition {
	if out.Err != nil {
		return transition{Action: actFail, Detail: fmt.Sprintf("stage %s: agent runner unreachable: %v", st.Name, out.Err)}
	}
	switch s := out.Ack.GetStatus(); s {
	case handoffv1.AckStatus_ACK_STATUS_ACCEPTED, handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
	case handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE:
		// The hub reroutes once to the stage's fallback, then escalates.
		if st.RejectedRole != "" && !arrivedBy(job, st.Name, handoffv1.Move_MOVE_REROUTE) {
			return move(p, job, st.Name, st.RejectedRole, handoffv1.Move_MOVE_REROUTE, nil)
		}
		detail := fmt.Sprintf("stage %s answered %s", st.Name, s)
		switch {
		case arrivedBy(job, st.Name, handoffv1.Move_MOVE_REROUTE):
			detail += fmt.Sprintf(" after the rail rerouted the job here from %s: rerouted once already", lastTransfer(job).GetFromStage())
		case st.RejectedRole == "":
			detail += " and declares no rejected_role fallback"
		}
		return escalation(causeFor(s), detail, out.Ack.GetReasons())
	default:
		return escalation(ackCause(out.Ack), fmt.Sprintf("stage %s answered %s", st.Name, s), out.Ack.GetReasons())
	}
	if out.Invalid != nil || out.Result == nil {
		// Fail closed on agent output: nothing of an invalid result enters the run.
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, fmt.Sprintf("stage %s returned an invalid result", st.Name), out.Invalid)
	}
	res := out.Result
	if res.GetStatus() == handoffv1.StageStatus_STAGE_STATUS_FAILED {
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, fmt.Sprintf("stage %s failed: %s", st.Name, res.GetError()), nil)
	}
	if st.Judges() {
		return afterJudge(p, st, job, w, res)
	}
	if t, stale := staleRevision(p, st, job, res); stale {
		return t
	}
	r := res.GetRoute()
	if len(st.Routes) == 0 {
		if r != nil {
			return undeclared(st, fmt.Sprintf("stage %s chose route %q but declares no routes", st.Name, r.GetName()), r.GetName())
		}
		return onward(p, st, job, handoffv1.Move_MOVE_NEXT, owes(p, job))
	}
	// The choice is the stage's; the check is the rail's: only a declared move is made.
	if r == nil {
		return undeclared(st, fmt.Sprintf("stage %s has routes (%s) and chose none", st.Name, strings.Join(st.RouteNames(), ", ")), "")
	}
	decl, ok := st.Route(r.GetName())
	if !ok {
		return undeclared(st, fmt.Sprintf("stage %s chose route %q, which it does not declare (its routes: %s)", st.Name, r.GetName(), strings.Join(st.RouteNames(), ", ")), r.GetName())
	}
	switch decl.To {
	case pipeline.ToEscalate:
		t := escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTED, fmt.Sprintf("stage %s chose route %s, which hands the job to a person%s", st.Name, r.GetName(), reasonText(r)), nil)
		t.Transfer = transfer(p, job, st.Name, decl.To, handoffv1.Move_MOVE_ROUTE, r)
		return t
	case pipeline.ToEnd:
		if owes(p, job) {
			return undeclared(st, fmt.Sprintf("stage %s chose route %s, which ends the job, but the job still owes its write: ending is a move only where no write is owed", st.Name, r.GetName()), r.GetName())
		}
		return transition{Action: actComplete, Transfer: transfer(p, job, st.Name, decl.To, handoffv1.Move_MOVE_ROUTE, r)}
	}
	return move(p, job, st.Name, decl.To, handoffv1.Move_MOVE_ROUTE, r)
}

// afterJudge applies a judge's verdict: PASS moves on, FAIL goes back to the stage whose work
// it judged with the failures (the critique loop), bounded by the wallet's revisions.
func afterJudge(p *pipeline.Pipeline, st *pipeline.Stage, job *handoffv1.Job, w stepWallet, res *handoffv1.StageResult) transition {
	ev := res.GetEvaluator()
	if r := res.GetRoute(); r != nil {
		// A judge's verdict is its route; it declares no other.
		return undeclared(st, fmt.Sprintf("judge %s chose route %q, but a judge's verdict is its only route", st.Name, r.GetName()), r.GetName())
	}
	switch ev.GetLastVerdict() {
	case handoffv1.Verdict_VERDICT_PASS:
		return onward(p, st, job, handoffv1.Move_MOVE_PASS, owes(p, job))
	case handoffv1.Verdict_VERDICT_FAIL:
	default:
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED, fmt.Sprintf("judge %s returned no verdict", st.Name), nil)
	}
	if len(st.ReviseStages()) == 0 {
		// A merge that judges has no stage to send the branches' results back to: a person
		// decides.
		return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED,
			fmt.Sprintf("judge %s failed the merged branch results, and nothing revises them", st.Name), failureReasons(ev))
	}
	exhausted := escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED,
		fmt.Sprintf("judge %s failed the work and no revisions are left", st.Name), failureReasons(ev))
	ok, take := w.revision(job.GetWallet())
	if !ok {
		return exhausted
	}
	t := move(p, job, st.Name, reviser(st, job), handoffv1.Move_MOVE_REVISE, nil)
	t.Revision, t.NoRevision = take, &exhausted
	return t
}

// onward moves the job on from st without a route choice: to its next: stage or the next in
// file order, or, after the last stage, to the end: the run completes.
// owed says whether the job still owes its write.
func onward(p *pipeline.Pipeline, st *pipeline.Stage, job *handoffv1.Job, how handoffv1.Move, owed bool) transition {
	ns, ok := p.Next(st.Name)
	if !ok {
		// Ending by file order is a move to the end like a route's: not while the job owes
		// its write (a last stage reached by a route or a fallback that forgot its next:).
		if owed {
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED,
				fmt.Sprintf("stage %s is the last in the pipeline and moves nowhere, but the job still owes its write: ending is a move only where no write is owed", st.Name),
				[]*handoffv1.Reason{{Field: "stage", Rule: "route.end", Message: fmt.Sprintf("stage %s ends the job before its write", st.Name)}})
		}
		return transition{Action: actComplete, Transfer: transfer(p, job, st.Name, pipeline.ToEnd, how, nil)}
	}
	return move(p, job, st.Name, ns.Name, how, nil)
}

// move is the transfer of the job from stage from to stage to, unless the two have handed
// the job straight back to each other more than max_bounces times (ping-pong). A bounce is a
// move back to the stage the job just came from (A to B, then B to A), by the stages' own
// choices or fixed order; a one-way repeat (draft, format, judge, draft, format) is none.
// A judge's PASS and FAIL are the critique loop, bounded by revisions, and pairs with a judge
// are that loop too. A person's decision starts the count again.
func move(p *pipeline.Pipeline, job *handoffv1.Job, from, to string, how handoffv1.Move, r *handoffv1.RouteChoice) transition {
	if counts(how) && !isJudge(p, from) && !isJudge(p, to) && cameFrom(job, from, to) {
		if n := bounces(job, from, to) + 1; n > p.MaxBounces {
			a, b := min(from, to), max(from, to)
			return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_PING_PONG,
				fmt.Sprintf("ping-pong between stages %s and %s: they handed the job straight back to each other %d times, and max_bounces is %d", a, b, n, p.MaxBounces),
				[]*handoffv1.Reason{{Field: "stages", Rule: "max_bounces", Message: fmt.Sprintf("%s and %s: %d bounces between them", a, b, n)}})
		}
	}
	return transition{Action: actMove, Transfer: transfer(p, job, from, to, how, r)}
}

// owes says whether the job still owes the pipeline's write.
func owes(p *pipeline.Pipeline, job *handoffv1.Job) bool {
	return p.Writes() && job.GetReceipt() == nil
}

// counts says whether a move counts towards its pair's bounces.
func counts(how handoffv1.Move) bool {
	return how == handoffv1.Move_MOVE_ROUTE || how == handoffv1.Move_MOVE_NEXT
}

// cameFrom reports whether the job's last move brought it to stage at from stage from, by a
// move that counts: a move from at to from is then a bounce.
func cameFrom(job *handoffv1.Job, at, from string) bool {
	ts := job.GetTransfers()
	if len(ts) == 0 {
		return false
	}
	last := ts[len(ts)-1]
	return counts(last.GetMove()) && last.GetFromStage() == from && last.GetToStage() == at
}

// bounces counts the earlier bounces between stages a and b since the last person's
// decision: moves between them, either way, that went straight back along the move before.
func bounces(job *handoffv1.Job, a, b string) int {
	n := 0
	var prev *handoffv1.Transfer
	for _, t := range job.GetTransfers() {
		if t.GetMove() == handoffv1.Move_MOVE_OPERATOR {
			n, prev = 0, t
			continue
		}
		between := (t.GetFromStage() == a && t.GetToStage() == b) || (t.GetFromStage() == b && t.GetToStage() == a)
		if between && counts(t.GetMove()) && prev != nil && counts(prev.GetMove()) &&
			prev.GetFromStage() == t.GetToStage() && prev.GetToStage() == t.GetFromStage() {
			n++
		}
		prev = t
	}
	return n
}

// transfer is the record of a move, with the visit of its arrival. A move that starts a new
// judge round (a verdict's) arrives for the first time in it.
func transfer(p *pipeline.Pipeline, job *handoffv1.Job, from, to string, how handoffv1.Move, r *handoffv1.RouteChoice) *handoffv1.Transfer {
	t := &handoffv1.Transfer{FromStage: from, ToStage: to, Move: how, Route: r, Hop: job.GetHops()}
	if !newRound(how) {
		t.Visit = visit(p, job, to)
	}
	return t
}

// newRound says whether a move starts a new judge round or operator return: a judge's verdict
// (the package after it carries one more round) or a person's decision.
func newRound(how handoffv1.Move) bool {
	return how == handoffv1.Move_MOVE_PASS || how == handoffv1.Move_MOVE_REVISE || how == handoffv1.Move_MOVE_OPERATOR
}

// visit counts the earlier arrivals of the run at stage in the current judge round and
// operator return (a judge's verdict or a person's decision starts a new one): with the round
// and the returns it names the stage's completion, so a stage a route sends the job back to
// runs again. The run's first stage counts its arrival at submit.
func visit(p *pipeline.Pipeline, job *handoffv1.Job, stage string) uint32 {
	ts := job.GetTransfers()
	start := -1 // the move that started the current round, if any
	for i := len(ts) - 1; i >= 0 && start < 0; i-- {
		if newRound(ts[i].GetMove()) {
			start = i
		}
	}
	n := uint32(0)
	if start < 0 {
		start = 0
		if first := p.First(); first != nil && first.Name == stage {
			n++ // submitted there
		}
	}
	for _, t := range ts[start:] {
		if t.GetToStage() == stage {
			n++
		}
	}
	return n
}

// reviser is the stage a judge's FAIL goes back to: the one the judged work came from (the
// latest stage the judge revises that moved the job to it), else the first it revises.
func reviser(judge *pipeline.Stage, job *handoffv1.Job) string {
	rs := judge.ReviseStages()
	ts := job.GetTransfers()
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].GetToStage() == judge.Name && slices.Contains(rs, ts[i].GetFromStage()) {
			return ts[i].GetFromStage()
		}
	}
	return judge.Revise
}

// lastTransfer is the run's latest move, nil before the first.
func lastTransfer(job *handoffv1.Job) *handoffv1.Transfer {
	if ts := job.GetTransfers(); len(ts) > 0 {
		return ts[len(ts)-1]
	}
	return nil
}

// arrivedBy reports whether the run's latest move brought it to stage by how.
func arrivedBy(job *handoffv1.Job, stage string, how handoffv1.Move) bool {
	t := lastTransfer(job)
	return t != nil && t.GetToStage() == stage && t.GetMove() == how
}

func isJudge(p *pipeline.Pipeline, name string) bool {
	st, _, ok := p.Stage(name)
	return ok && st.Judges()
}

// chooseVersion is the contract version a hop is sent in: the newest the stage's agent
// declares (accepts) that the run can be written in. handoff.v2 needs the run's deadline
// (budget.deadline is required there), so a run without one (submitted before deadlines)
// goes as v1; an agent that declares neither gets v1, and its REJECTED_SCHEMA naming the
// version escalates the run: the rail never sends a version nobody declared as if it were
// another.
func chooseVersion(accepts []string, hasDeadline bool) string {
	if hasDeadline && slices.Contains(accepts, contract.V2) {
		return contract.V2
	}
	return contract.V1
}

func escalation(cause handoffv1.EscalationCause, detail string, reasons []*handoffv1.Reason) transition {
	return transition{Action: actEscalate, Cause: cause, Detail: detail, Reasons: reasons}
}

// undeclared is the escalation of a move the stage does not declare: it names the route
// (when there is one) and the routes declared.
func undeclared(st *pipeline.Stage, detail, route string) transition {
	declared := strings.Join(st.RouteNames(), ", ")
	if declared == "" {
		declared = "none"
	}
	return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED, detail,
		[]*handoffv1.Reason{{Field: "route.name", Rule: "route.declared", Message: fmt.Sprintf("route %q; declared: %s", route, declared)}})
}

func reasonText(r *handoffv1.RouteChoice) string {
	if r.GetReason() == "" {
		return ""
	}
	return ": " + r.GetReason()
}

// ackCause is the escalation cause of a refusal: causeFor its status, except that a
// REJECTED_BUDGET for the job's deadline (reason budget.deadline) is DEADLINE.
func ackCause(ack *handoffv1.Ack) handoffv1.EscalationCause {
	if ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET {
		for _, r := range ack.GetReasons() {
			if r.GetRule() == contract.RuleBudgetDeadline {
				return handoffv1.EscalationCause_ESCALATION_CAUSE_DEADLINE
			}
		}
	}
	return causeFor(ack.GetStatus())
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

func latestArtifact(arts []*handoffv1.Artifact, schemaVersion string) *handoffv1.Artifact {
	for i := len(arts) - 1; i >= 0; i-- {
		if schemaVersion == "" || arts[i].GetSchemaVersion() == schemaVersion {
			return arts[i]
		}
	}
	return nil
}
