package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// Review: resolved_questions are "open questions of the package this stage resolved, each
// named exactly as the package carries it" (agentrunner.proto). The rail removes them from
// all the run's questions instead, so a stage can close a question its package never
// carried (the package carries the newest 32; the run keeps them all).
func TestReviewResolvedOnlyWhatThePackageCarried(t *testing.T) {
	var qs []string
	for i := range 32 {
		qs = append(qs, fmt.Sprintf("question %02d", i))
	}
	intake := &recorder{name: "intake", questions: qs}
	draft := &recorder{name: "draft", questions: []string{"question 32", "question 33"}}
	judge := &recorder{name: "judge", verdicts: pass(), resolved: []string{"question 00"}}
	e := startCarry(t, nil, "revise", intake, draft, judge, nil)
	job, evs := e.submit(t, "carry", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job %s: %v; %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if slices.Contains(judge.got[0].GetOpenQuestions(), "question 00") {
		t.Fatalf("the judge's package carried question 00: the setup does not test what it means to")
	}
	if !slices.Contains(job.GetOpenQuestions(), "question 00") {
		t.Errorf("the judge closed question 00, which its package never carried; run's open questions: %q", job.GetOpenQuestions())
	}
}

// innerJudgedYAML: the inner pipeline with a judge of its own.
const innerJudgedYAML = `
name: inner
max_hops: 10
max_revisions: 2
escalation: {route: humans}
stages:
  - {name: gather, input: raw_ticket.v1, output: {type: facts, schema_version: facts.v1}, criteria: [gathered]}
  - {name: work, input: facts.v1, output: {type: note, schema_version: note.v1}, criteria: [worked]}
  - {name: check, kind: judge, revise: work, input: note.v1, output: {type: verdict, schema_version: verdict.v1}, criteria: [checked]}
`

// Review: a sub-job's verdicts are recorded on its parent's wallet (driver.recordVerdict),
// but only its artifact returns to the parent, not its evaluator. When the nested run's
// judge failed once and then passed, the wallet holds "failed once, last PASS" while the
// parent's next package carries no evaluator: Admit reads that as a silent reset and the
// parent's next stage is refused, though no judge of the parent ever failed.
func TestReviewSubJobJudgeFailThenPassDoesNotResetParent(t *testing.T) {
	pls := map[string]*pipeline.Pipeline{}
	for name, y := range map[string]string{"inner.yaml": innerJudgedYAML, "outer.yaml": fmt.Sprintf(outerYAML, 8)} {
		p, problems, err := pipeline.Parse(name, []byte(y))
		if err != nil || pipeline.HasErrors(problems) {
			t.Fatalf("%s: %v %v", name, err, problems)
		}
		pls[p.Name] = p
	}
	if problems := pipeline.CheckSubJobs(pls); pipeline.HasErrors(problems) {
		t.Fatalf("sub-jobs: %v", problems)
	}
	polish := &router{name: "polish", out: "note"}
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.st, e.client = startStack(t, stack.Config{Pipelines: pls, Agents: []agentrunner.Agent{
		&router{name: "gather", out: "facts"}, &recorder{name: "work"}, &recorder{name: "check", verdicts: failThenPass()},
		polish, &router{name: "judge", verdict: handoffv1.Verdict_VERDICT_PASS}}})
	e.input = mustInput(t, e.st)
	job, evs := e.submit(t, "outer", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s escalation %v (polish ran %d times); timeline %v", job.GetState(), job.GetEscalation(), polish.calls(), kinds(evs))
	}
}

// piiBranch is a branch stage whose result says something in its prose.
type piiBranch struct {
	*branchAgent
	questions []string
	hint      string
}

func (a *piiBranch) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	res, err := a.branchAgent.Run(ctx, in)
	if err == nil {
		res.OpenQuestions, res.NextHint = a.questions, a.hint
	}
	return res, err
}

// Review: the rail screens a stage's result for personal data before any of it is recorded
// (pii.go, with the pipeline's own pii.patterns), but a branch hop (fanout.go) only
// validates it, and the runner's own screen knows the built-in detectors only. So a
// branch's open question holding what the pipeline's pattern names personal data (an
// employee id) is recorded as is in the branch's STAGE_RESULT event, which WatchJob,
// GetJob's timeline and ExplainJob serve to any identity. The same question from a
// top-level stage is refused.
func TestReviewBranchResultIsScreenedForPII(t *testing.T) {
	const emp = "EMP-123-4567"
	y := strings.Replace(fanYAML(2, "escalate", "finish_in_flight", "30s"), "tools:\n",
		"pii:\n  policy: reject\n  patterns:\n    - {name: employee_id, regex: '\\bEMP-\\d{3}-\\d{4}\\b'}\ntools:\n", 1)
	p, problems, err := pipeline.Parse("fan.yaml", []byte(y))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("fan pipeline with pii patterns: %v %v", err, problems)
	}
	b1 := &piiBranch{branchAgent: &branchAgent{name: "s1"}, questions: []string{"ask " + emp + " for the order id?"}}
	e := &fanEnv{env: &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}, merge: &mergeAgent{}}
	e.st, e.client = startStack(t, stack.Config{Pipelines: map[string]*pipeline.Pipeline{p.Name: p},
		Agents: []agentrunner.Agent{e.merge, b1, &branchAgent{name: "s2"}}})
	e.input = mustInput(t, e.st)
	job, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
	for _, ev := range evs {
		if s := prototext.Format(ev); strings.Contains(s, emp) {
			t.Errorf("event %s (branch %q, stage %s) holds the employee id a branch wrote (run ended %s)", ev.GetKind(), ev.GetBranch(), ev.GetStage(), job.GetState())
		}
	}
}

// Review: a branch stage's open questions, next hint and memory refs are dropped: only its
// artifacts and tool attempts enter the run (fanout.go), so the merge never hears the
// question a branch raised ("context is carried, not overwritten", carry.go).
func TestReviewBranchQuestionReachesMerge(t *testing.T) {
	b1 := &piiBranch{branchAgent: &branchAgent{name: "s1"}, questions: []string{"which warehouse shipped it?"}}
	p, problems, err := pipeline.Parse("fan.yaml", []byte(fanYAML(2, "escalate", "finish_in_flight", "30s")))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("fan pipeline: %v %v", err, problems)
	}
	e := &fanEnv{env: &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}, merge: &mergeAgent{}}
	e.st, e.client = startStack(t, stack.Config{Pipelines: map[string]*pipeline.Pipeline{p.Name: p},
		Agents: []agentrunner.Agent{e.merge, b1, &branchAgent{name: "s2"}}})
	e.input = mustInput(t, e.st)
	job, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s %v; %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if !slices.Contains(job.GetOpenQuestions(), "which warehouse shipped it?") {
		t.Errorf("the branch's open question was dropped: run's open questions %q", job.GetOpenQuestions())
	}
}

// Review: mutual sub-jobs (ping runs pong as a sub-job, pong runs ping) are refused only by
// pipeline.Load (CheckSubJobs); coordinator.New takes any Pipelines map and checks nothing
// of it, and the driver has no nesting depth cap, so an assembly that does not go through
// Load (internal/stack, an embedding) nests runs until the wallet or the run id's length
// gives out. New should refuse the map as Load does (fail closed).
func TestReviewMutualSubJobsRefusedByNew(t *testing.T) {
	const y = `
name: %s
max_hops: 10
escalation: {route: humans}
stages:
  - name: sub
    kind: subjob
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    criteria: [returned]
    subjob: {pipeline: %s, objective: "Do it.", output: note.v1, stop: completed, max_hops: 5}
  - {name: work, input: note.v1, output: {type: note, schema_version: note.v1}, criteria: [worked]}
`
	pls := map[string]*pipeline.Pipeline{}
	for _, n := range [][2]string{{"ping", "pong"}, {"pong", "ping"}} {
		p, problems, err := pipeline.Parse(n[0]+".yaml", []byte(fmt.Sprintf(y, n[0], n[1])))
		if err != nil || pipeline.HasErrors(problems) {
			t.Fatalf("%s: %v %v", n[0], err, problems)
		}
		pls[p.Name] = p
	}
	if !pipeline.HasErrors(pipeline.CheckSubJobs(pls)) {
		t.Fatal("CheckSubJobs passes mutual sub-jobs: the setup does not test what it means to")
	}
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), Pipelines: pls, Logger: testLogger(t),
		CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Agents: []agentrunner.Agent{&recorder{name: "work"}}})
	if err == nil {
		st.Close()
		t.Errorf("the stack started with pipelines that run each other as sub-jobs")
	}
}
