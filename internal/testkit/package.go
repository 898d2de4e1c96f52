package testkit

import (
	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Traceparent is the W3C trace context of the packages Package makes.
const Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// The fields of the package Package makes.
const (
	JobID = "job-1"
	Stage = "draft"
	Goal  = "answer the ticket"
)

// Package returns a valid handoff.v1 package (job JobID at stage Stage, a budget with
// money, revisions and hops left, a trace), changed by each mod in turn. Each call returns
// a new package, so a test may change it freely.
func Package(mods ...func(*handoffv1.HandoffPackage)) *handoffv1.HandoffPackage {
	p := &handoffv1.HandoffPackage{
		Schema: "handoff.v1", JobId: JobID, Stage: Stage, Goal: Goal,
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000, RevisionsRemaining: 2, HopsRemaining: 5},
		Trace:  &handoffv1.Trace{Traceparent: Traceparent},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

// AtStage sets the package's stage.
func AtStage(stage string) func(*handoffv1.HandoffPackage) {
	return func(p *handoffv1.HandoffPackage) { p.Stage = stage }
}

// OfJob sets the package's job.
func OfJob(job string) func(*handoffv1.HandoffPackage) {
	return func(p *handoffv1.HandoffPackage) { p.JobId = job }
}

// WithBudget sets the package's budget.
func WithBudget(b *handoffv1.Budget) func(*handoffv1.HandoffPackage) {
	return func(p *handoffv1.HandoffPackage) { p.Budget = b }
}

// Passed gives the package the judge's PASS (one round), as a package bound for writeback
// carries.
func Passed() func(*handoffv1.HandoffPackage) {
	return func(p *handoffv1.HandoffPackage) {
		p.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: 1}
	}
}
