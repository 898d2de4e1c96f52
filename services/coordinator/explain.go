package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

// The five questions of a hop that lost its context, answered from a run's events: each
// PACKAGE_SENT keeps the exact package the stage started from, the ack says what the
// receiver refused, the stage result what it called and read. Explain is pure; it names
// fields, stages, tools, verdicts and artifact URIs, and never prints what the package
// said (goal, constraints, questions, hints).

// ExplainJob reads the run and its events and explains them (Explain).
func (s *Server) ExplainJob(ctx context.Context, req *handoffv1.ExplainJobRequest) (*handoffv1.ExplainJobResponse, error) {
	job, err := s.opts.Store.GetRun(ctx, req.GetRunId())
	if err != nil {
		return nil, storeErr(err, req.GetRunId())
	}
	evs, err := s.opts.Store.Events(ctx, req.GetRunId(), 0)
	if err != nil {
		return nil, storeErr(err, req.GetRunId())
	}
	return &handoffv1.ExplainJobResponse{Explanation: Explain(job, evs)}, nil
}

// hopEvents is what one hop left on the timeline.
type hopEvents struct {
	sent     *handoffv1.JobEvent
	pkg      *handoffv1.HandoffPackage // nil: not kept (an event from before packages were)
	ack      *handoffv1.Ack
	result   *handoffv1.StageResult
	verdict  *handoffv1.Evaluator
	transfer *handoffv1.Transfer
	esc      *handoffv1.Escalation
	ackHop   uint32 // the hop number the ack was counted as
}

// Explain answers the five questions for every hop of run job from its events evs.
func Explain(job *handoffv1.Job, evs []*handoffv1.JobEvent) *handoffv1.Explanation {
	out := &handoffv1.Explanation{RunId: job.GetRunId(), JobId: job.GetJobId(), Pipeline: job.GetPipeline(), State: job.GetState()}
	// The verdicts given before the hop being explained: judges' and people's PASS.
	var given []*handoffv1.JobEvent
	var hops []*hopEvents
	var cur *hopEvents
	// The branch hops in flight, by branch and stage: branches of a parallel stage run at
	// once, so their events interleave and a hop number is only known at the ack.
	branches := map[string]*hopEvents{}
	var verdicts [][]*handoffv1.JobEvent // verdicts given before each hop
	for _, ev := range evs {
		switch ev.GetKind() {
		case handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT:
			h := &hopEvents{sent: ev, pkg: sentPackage(ev)}
			if b := ev.GetBranch(); b != "" {
				branches[b+"/"+ev.GetStage()] = h
			} else {
				cur = h
			}
			hops = append(hops, h)
			verdicts = append(verdicts, slices.Clone(given))
			continue
		case handoffv1.EventKind_EVENT_KIND_RESOLVED:
			if ev.GetResolution().GetAction() == handoffv1.ResolutionAction_RESOLUTION_ACTION_APPROVE {
				given = append(given, ev)
			}
			cur = nil
			continue
		}
		cur := cur
		if b := ev.GetBranch(); b != "" {
			if cur = branches[b+"/"+ev.GetStage()]; cur == nil {
				continue
			}
		} else if cur == nil || ev.GetHop() != cur.sent.GetHop() {
			continue
		}
		switch ev.GetKind() {
		case handoffv1.EventKind_EVENT_KIND_ACK:
			cur.ack = ev.GetAck()
			cur.ackHop = ev.GetHop()
		case handoffv1.EventKind_EVENT_KIND_STAGE_RESULT:
			cur.result = ev.GetResult()
		case handoffv1.EventKind_EVENT_KIND_VERDICT:
			cur.verdict = ev.GetEvaluator()
			given = append(given, ev)
		case handoffv1.EventKind_EVENT_KIND_ESCALATED:
			cur.esc = ev.GetEscalation()
		}
		if t := ev.GetTransfer(); t != nil {
			cur.transfer = t
		}
	}
	for i, h := range hops {
		he := &handoffv1.HopExplanation{Hop: h.sent.GetHop(), Stage: h.sent.GetStage(), Ack: h.ack.GetStatus(), Schema: h.sent.GetSchema()}
		if h.sent.GetBranch() != "" && h.ackHop != 0 {
			he.Hop = h.ackHop // a branch hop is counted when its ack arrives
		}
		if he.Schema == "" && h.pkg != nil {
			he.Schema = h.pkg.GetSchema()
		}
		he.Answers = []*handoffv1.Answer{
			sameJob(job, h),
			requiredField(h),
			evaluatorState(h, verdicts[i]),
			burnedTools(h),
			artifactsRead(h),
		}
		out.Hops = append(out.Hops, he)
		out.Violations = append(out.Violations, violations(job, h, he)...)
	}
	return out
}

// sentPackage is the package a PACKAGE_SENT event kept, as v1 (a v2 package converted).
func sentPackage(ev *handoffv1.JobEvent) *handoffv1.HandoffPackage {
	if p := ev.GetPackage(); p != nil {
		return p
	}
	if p2 := ev.GetPackageV2(); p2 != nil {
		if p, err := contract.V2ToV1(p2); err == nil {
			return p
		}
	}
	return nil
}

func answer(q handoffv1.Question, f handoffv1.Finding, summary string, ev ...*handoffv1.Evidence) *handoffv1.Answer {
	return &handoffv1.Answer{Question: q, Finding: f, Summary: summary, Evidence: ev}
}

func unknown(q handoffv1.Question) *handoffv1.Answer {
	return answer(q, handoffv1.Finding_FINDING_UNKNOWN, "the package sent was not kept (an event from before packages were)")
}

// sameJob: job_id on the package, the ack and the result, against the run's.
func sameJob(job *handoffv1.Job, h *hopEvents) *handoffv1.Answer {
	q := handoffv1.Question_QUESTION_SAME_JOB
	if h.pkg == nil {
		return unknown(q)
	}
	var bad []*handoffv1.Evidence
	for _, c := range []struct{ where, id string }{{"package.job_id", h.pkg.GetJobId()}, {"ack.job_id", h.ack.GetJobId()}, {"result.job_id", h.result.GetJobId()}} {
		if c.id != "" && c.id != job.GetJobId() {
			bad = append(bad, &handoffv1.Evidence{Field: c.where, Note: "differs from the run's job_id"})
		}
	}
	if len(bad) > 0 {
		return answer(q, handoffv1.Finding_FINDING_VIOLATION, "job_id changed at this hop", bad...)
	}
	return answer(q, handoffv1.Finding_FINDING_OK, "job_id is the run's on package, ack and result", &handoffv1.Evidence{Field: "job_id"})
}

// requiredField: the ack's reasons, when it refused the package.
func requiredField(h *hopEvents) *handoffv1.Answer {
	q := handoffv1.Question_QUESTION_REQUIRED_FIELD
	switch {
	case h.ack == nil:
		return answer(q, handoffv1.Finding_FINDING_UNKNOWN, "no ack was recorded (the receiver was not reached)")
	case len(h.ack.GetReasons()) == 0:
		return answer(q, handoffv1.Finding_FINDING_OK, "none: "+ackName(h.ack.GetStatus()))
	}
	var ev []*handoffv1.Evidence
	var fields []string
	for _, r := range h.ack.GetReasons() {
		ev = append(ev, &handoffv1.Evidence{Field: r.GetField(), Stage: h.sent.GetStage(), Note: r.GetRule()})
		fields = append(fields, r.GetField())
	}
	return answer(q, handoffv1.Finding_FINDING_VIOLATION, fmt.Sprintf("%s: %s", ackName(h.ack.GetStatus()), strings.Join(fields, ", ")), ev...)
}

// evaluatorState: the evaluator the stage started with, against the verdicts given before
// the hop. After a FAIL, none or a PASS no judge gave is a silent reset.
func evaluatorState(h *hopEvents, given []*handoffv1.JobEvent) *handoffv1.Answer {
	q := handoffv1.Question_QUESTION_EVALUATOR
	if h.pkg == nil {
		return unknown(q)
	}
	ev := h.pkg.GetEvaluator()
	started := "no evaluator (no judge had run)"
	if ev != nil {
		started = fmt.Sprintf("%s after %d round(s)", verdictName(ev.GetLastVerdict()), ev.GetRounds())
		if codes := failureCodes(ev); codes != "" {
			started += " (" + codes + ")"
		}
	}
	failed, last, lastStage := false, handoffv1.Verdict_VERDICT_UNSPECIFIED, ""
	for _, g := range given {
		v := handoffv1.Verdict_VERDICT_PASS // a person's approve
		if g.GetKind() == handoffv1.EventKind_EVENT_KIND_VERDICT {
			v = g.GetEvaluator().GetLastVerdict()
		}
		failed = failed || v == handoffv1.Verdict_VERDICT_FAIL
		last, lastStage = v, g.GetStage()
	}
	evidence := []*handoffv1.Evidence{{Field: "evaluator.last_verdict", Note: verdictName(ev.GetLastVerdict())}}
	if last != handoffv1.Verdict_VERDICT_UNSPECIFIED {
		evidence = append(evidence, &handoffv1.Evidence{Stage: lastStage, Note: "last verdict given: " + verdictName(last)})
	}
	reset := failed && (ev.GetLastVerdict() == handoffv1.Verdict_VERDICT_UNSPECIFIED ||
		(ev.GetLastVerdict() == handoffv1.Verdict_VERDICT_PASS && last != handoffv1.Verdict_VERDICT_PASS))
	if reset {
		how := "started as if the failed judge had passed"
		if h.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
			how += "; the receiver refused it"
		}
		return answer(q, handoffv1.Finding_FINDING_VIOLATION, "started with "+started+": "+how, evidence...)
	}
	return answer(q, handoffv1.Finding_FINDING_OK, "started with "+started, evidence...)
}

// burnedTools: tools the stage called that the package showed as failed.
func burnedTools(h *hopEvents) *handoffv1.Answer {
	q := handoffv1.Question_QUESTION_BURNED_TOOLS
	if h.pkg == nil {
		return unknown(q)
	}
	if h.result == nil {
		return answer(q, handoffv1.Finding_FINDING_NOT_APPLICABLE, "no stage result: the stage called nothing")
	}
	burned := map[string]string{} // tool -> stage that burned it
	for _, a := range h.pkg.GetToolsTried() {
		if !a.GetOk() {
			burned[a.GetName()] = a.GetStage()
		}
	}
	var retried []*handoffv1.Evidence
	for i, a := range h.result.GetToolsTried() {
		if by, ok := burned[a.GetName()]; ok || a.GetRetry() {
			retried = append(retried, &handoffv1.Evidence{Field: fmt.Sprintf("result.tools_tried[%d]", i), Stage: by, Note: a.GetName()})
		}
	}
	if len(retried) > 0 {
		return answer(q, handoffv1.Finding_FINDING_VIOLATION, fmt.Sprintf("called %d tool(s) an earlier stage had burned", len(retried)), retried...)
	}
	return answer(q, handoffv1.Finding_FINDING_OK, fmt.Sprintf("called %d tool(s), none burned before (%d burned in the package)", len(h.result.GetToolsTried()), len(burned)))
}

// artifactsRead: what the runner recorded the stage reading, against what it was given.
func artifactsRead(h *hopEvents) *handoffv1.Answer {
	q := handoffv1.Question_QUESTION_ARTIFACTS_READ
	if h.pkg == nil {
		return unknown(q)
	}
	if h.result == nil || h.ack.GetStatus() == handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		return answer(q, handoffv1.Finding_FINDING_NOT_APPLICABLE, "the stage did no work at this hop")
	}
	given := map[string]bool{}
	for _, a := range h.pkg.GetArtifacts() {
		given[a.GetUri()] = true
	}
	var ev []*handoffv1.Evidence
	var notGiven int
	for _, uri := range h.result.GetArtifactsRead() {
		note := "read, given"
		if !given[uri] {
			note = "read, not given"
			notGiven++
		}
		ev = append(ev, &handoffv1.Evidence{Field: "result.artifacts_read", Uri: uri, Note: note})
	}
	n, g := len(h.result.GetArtifactsRead()), len(given)
	switch {
	case notGiven > 0:
		return answer(q, handoffv1.Finding_FINDING_VIOLATION, fmt.Sprintf("read %d artifact(s) it was not given", notGiven), ev...)
	case n == 0 && g > 0:
		return answer(q, handoffv1.Finding_FINDING_VIOLATION, fmt.Sprintf("read none of the %d artifact(s) it was given: it worked from the package alone", g))
	}
	return answer(q, handoffv1.Finding_FINDING_OK, fmt.Sprintf("read %d of the %d artifact(s) it was given", n, g), ev...)
}

// violations are the hop's breaches of the four rules the explanation flags.
func violations(job *handoffv1.Job, h *hopEvents, he *handoffv1.HopExplanation) []*handoffv1.Violation {
	var out []*handoffv1.Violation
	add := func(k handoffv1.ViolationKind, detail string, ev ...*handoffv1.Evidence) {
		out = append(out, &handoffv1.Violation{Kind: k, Hop: he.GetHop(), Stage: he.GetStage(), Detail: detail, Evidence: ev})
	}
	for _, a := range he.GetAnswers() {
		if a.GetFinding() != handoffv1.Finding_FINDING_VIOLATION {
			continue
		}
		switch a.GetQuestion() {
		case handoffv1.Question_QUESTION_EVALUATOR:
			add(handoffv1.ViolationKind_VIOLATION_KIND_SILENT_RESET, a.GetSummary(), a.GetEvidence()...)
		case handoffv1.Question_QUESTION_BURNED_TOOLS:
			add(handoffv1.ViolationKind_VIOLATION_KIND_BURNED_TOOL_RETRIED, a.GetSummary(), a.GetEvidence()...)
		}
	}
	if h.transfer.GetMove() == handoffv1.Move_MOVE_STALE_REVISION || h.esc.GetCause() == handoffv1.EscalationCause_ESCALATION_CAUSE_STALE_PLAN {
		var ev []*handoffv1.Evidence
		for _, r := range h.esc.GetReasons() {
			ev = append(ev, &handoffv1.Evidence{Field: "result." + r.GetField(), Note: r.GetRule()})
		}
		if len(ev) == 0 {
			ev = append(ev, &handoffv1.Evidence{Field: "result.artifacts", Note: RuleStalePlan})
		}
		add(handoffv1.ViolationKind_VIOLATION_KIND_STALE_PLAN, FailureStaleDetail, ev...)
	}
	if p := h.pkg; p != nil {
		var ev []*handoffv1.Evidence
		if p.GetGoal() != job.GetGoal() {
			ev = append(ev, &handoffv1.Evidence{Field: "goal", Note: "differs from the goal fixed at submit"})
		}
		if !slices.Equal(p.GetConstraints(), job.GetConstraints()) {
			ev = append(ev, &handoffv1.Evidence{Field: "constraints", Note: "differ from the constraints fixed at submit"})
		}
		if len(ev) > 0 {
			add(handoffv1.ViolationKind_VIOLATION_KIND_GOAL_CHANGED, "the package's goal or constraints are not the run's", ev...)
		}
	}
	return out
}

func ackName(s handoffv1.AckStatus) string { return strings.TrimPrefix(s.String(), "ACK_STATUS_") }

func verdictName(v handoffv1.Verdict) string {
	if v == handoffv1.Verdict_VERDICT_UNSPECIFIED {
		return "none"
	}
	return strings.TrimPrefix(v.String(), "VERDICT_")
}

func failureCodes(ev *handoffv1.Evaluator) string {
	var codes []string
	for _, f := range ev.GetFailures() {
		codes = append(codes, f.GetCode())
	}
	return strings.Join(codes, ", ")
}
