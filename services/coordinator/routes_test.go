package coordinator_test

// Routes end to end, on real gRPC over loopback (internal/stack): the rail makes only
// declared moves, stops a ping-pong, and reroutes a rejected role once.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// routedYAML: sort chooses draft, back (to resort, which routes back to sort) or person
// (escalate); it holds kb.search, and falls back to sort-backup when its runner cannot
// serve the role.
const routedYAML = `
name: routed
max_hops: 20
max_revisions: 1
max_bounces: 2
escalation: {route: humans}
tools:
  - {name: kb.search, access: read, system: helpcenter}
  - {name: crm.patch, access: write, system: crm}
stages:
  - name: sort
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    tools: [kb.search]
    criteria: [sorted]
    rejected_role: sort-backup
    routes:
      - {name: draft, description: "Ready to draft.", to: draft}
      - {name: back, description: "Needs sorting again.", to: resort}
      - {name: person, description: "A person decides.", to: escalate}
  - name: resort
    input: note.v1
    output: {type: note, schema_version: note.v1}
    criteria: [resorted]
    routes:
      - {name: sort, description: "Sort it again.", to: sort}
  - name: sort-backup
    agent: backup
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    tools: [kb.search]
    criteria: [sorted]
    next: draft
  - name: draft
    input: note.v1
    output: {type: summary, schema_version: summary.v1}
    criteria: [drafted]
  - name: judge
    kind: judge
    revise: draft
    input: summary.v1
    output: {type: verdict, schema_version: verdict.v1}
    criteria: [judged]
  - name: writeback
    kind: writeback
    input: summary.v1
    writer: {system: crm, target: ledger}
    tools: [crm.patch]
    output: {type: crm_receipt, schema_version: crm_receipt.v1}
    criteria: [written]
`

// router is a scripted agent that chooses a route (choose returns "" for none), stores one
// artifact per call, and records every package and the routes it was offered.
type router struct {
	name   string
	tools  []string
	out    string // artifact type written
	spend  int64
	choose func(n int, in agentrunner.Input) string
	// verdict, when set, makes it a judge.
	verdict handoffv1.Verdict

	mu      sync.Mutex
	got     []*handoffv1.HandoffPackage
	offered [][]string
}

func (r *router) Card() agentrunner.RoleCard {
	return agentrunner.RoleCard{Name: r.name, Tools: r.tools}
}

func (r *router) calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func (r *router) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	r.mu.Lock()
	n := len(r.got)
	r.got = append(r.got, proto.Clone(in.Package).(*handoffv1.HandoffPackage))
	var names []string
	for _, o := range in.Routes {
		names = append(names, o.GetName())
	}
	r.offered = append(r.offered, names)
	r.mu.Unlock()
	res := &handoffv1.StageResult{SpentUsdMicros: r.spend}
	if r.verdict != handoffv1.Verdict_VERDICT_UNSPECIFIED {
		res.Evaluator = &handoffv1.Evaluator{LastVerdict: r.verdict, Rounds: in.Round + 1}
		return res, nil
	}
	a, err := in.Artifacts.Put(ctx, artifact.Ref{JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: r.out, SchemaVersion: r.out + ".v1", MediaType: "text/plain"}, []byte(fmt.Sprintf("%s call %d", r.name, n+1)))
	if err != nil {
		return nil, err
	}
	res.Artifacts = []*handoffv1.Artifact{a}
	if r.choose != nil {
		if name := r.choose(n, in); name != "" {
			res.Route = &handoffv1.RouteChoice{Name: name, Reason: fmt.Sprintf("call %d", n+1), Priority: handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL}
		}
	}
	return res, nil
}

type routedEnv struct {
	*env
	sort, resort, backup, draft, judge *router
}

func always(route string) func(int, agentrunner.Input) string {
	return func(int, agentrunner.Input) string { return route }
}

// startRouted runs the stack with the routed pipeline; sort answers with choose. sortTools
// and backupTools are the tools the sort and backup agents' role cards hold.
func startRouted(t *testing.T, choose func(int, agentrunner.Input) string, sortTools, backupTools []string) *routedEnv {
	t.Helper()
	p, problems, err := pipeline.Parse("routed.yaml", []byte(routedYAML))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("routed pipeline: %v %v", err, problems)
	}
	e := &routedEnv{env: &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}},
		sort:   &router{name: "sort", tools: sortTools, out: "note", spend: 10_000, choose: choose},
		resort: &router{name: "resort", out: "note", spend: 10_000, choose: always("sort")},
		backup: &router{name: "backup", tools: backupTools, out: "note", spend: 10_000},
		draft:  &router{name: "draft", out: "summary", spend: 20_000},
		judge:  &router{name: "judge", spend: 5_000, verdict: handoffv1.Verdict_VERDICT_PASS},
	}
	e.st, e.client = startStack(t, stack.Config{
		Pipelines: map[string]*pipeline.Pipeline{p.Name: p},
		Agents:    []agentrunner.Agent{e.sort, e.resort, e.backup, e.draft, e.judge},
	})
	e.input = mustInput(t, e.st)
	return e
}

func (e *routedEnv) agentCalls() map[string]int {
	return map[string]int{"sort": e.sort.calls(), "resort": e.resort.calls(), "backup": e.backup.calls(), "draft": e.draft.calls(), "judge": e.judge.calls()}
}

func moveList(job *handoffv1.Job) []string {
	var out []string
	for _, t := range job.GetTransfers() {
		s := fmt.Sprintf("%s->%s:%s", t.GetFromStage(), t.GetToStage(), strings.TrimPrefix(t.GetMove().String(), "MOVE_"))
		if r := t.GetRoute(); r != nil {
			s += "(" + r.GetName() + ")"
		}
		out = append(out, s)
	}
	return out
}

var kb = []string{"kb.search"}

// TestUndeclaredRouteEscalates: a stage that answers a route it does not declare escalates
// ROUTE_UNDECLARED, naming the route and the declared ones, and no other agent is called.
func TestUndeclaredRouteEscalates(t *testing.T) {
	e := startRouted(t, always("shipping"), kb, nil)
	job, evs := e.submit(t, "routed", "tkt_1", "", e.defaultBudget)
	esc := job.GetEscalation()
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), esc, kinds(evs))
	}
	if !strings.Contains(esc.GetDetail(), `"shipping"`) || !strings.Contains(esc.GetDetail(), "draft, back, person") || esc.GetStage() != "sort" {
		t.Errorf("escalation %v: want it to name the route shipping and the declared draft, back, person", esc)
	}
	if want := map[string]int{"sort": 1}; !callsAre(e.agentCalls(), want) {
		t.Fatalf("agent calls %v; want only sort's one", e.agentCalls())
	}
	if got := e.sort.offered[0]; !slices.Equal(got, []string{"draft", "back", "person"}) {
		t.Errorf("sort was offered %v", got)
	}
	if len(job.GetTransfers()) != 0 || e.writes(t) != 0 || job.GetHops() != 1 {
		t.Errorf("transfers %v, writes %d, hops %d; want no move, no write, one hop", moveList(job), e.writes(t), job.GetHops())
	}
}

// TestRoutedStageWithoutRouteEscalates: a stage that has routes and answers none escalates;
// the rail does not guess one (say, the first) and calls no one else.
func TestRoutedStageWithoutRouteEscalates(t *testing.T) {
	e := startRouted(t, always(""), kb, nil)
	job, evs := e.submit(t, "routed", "tkt_1", "", e.defaultBudget)
	esc := job.GetEscalation()
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTE_UNDECLARED ||
		!strings.Contains(esc.GetDetail(), "chose none") {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), esc, kinds(evs))
	}
	if want := map[string]int{"sort": 1}; !callsAre(e.agentCalls(), want) {
		t.Fatalf("agent calls %v; want only sort's one", e.agentCalls())
	}
}

// TestPingPongEscalates: sort and resort route the job to each other forever. The rail
// escalates PING_PONG naming the pair once they bounced more than max_bounces (2) times,
// long before the hop cap (20), and the wallet is charged for the hops made only: four
// hops, four agent runs (each visit a new completion, not a free DUPLICATE), their spend.
func TestPingPongEscalates(t *testing.T) {
	e := startRouted(t, always("back"), kb, nil)
	job, evs := e.submit(t, "routed", "tkt_1", "", e.defaultBudget)
	esc := job.GetEscalation()
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_PING_PONG {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), esc, kinds(evs))
	}
	if !strings.Contains(esc.GetDetail(), "between stages resort and sort") || esc.GetStage() != "resort" {
		t.Errorf("escalation %v: want it to name the pair resort and sort", esc)
	}
	want := []string{"sort->resort:ROUTE(back)", "resort->sort:ROUTE(sort)", "sort->resort:ROUTE(back)"}
	if got := moveList(job); !slices.Equal(got, want) {
		t.Fatalf("moves %v, want %v", got, want)
	}
	if want := map[string]int{"sort": 2, "resort": 2}; !callsAre(e.agentCalls(), want) {
		t.Fatalf("agent calls %v; want %v", e.agentCalls(), want)
	}
	if job.GetHops() != 4 || job.GetWallet().GetHopsRemaining() != 20-4 {
		t.Errorf("hops %d, %d left; want 4 made, 16 left", job.GetHops(), job.GetWallet().GetHopsRemaining())
	}
	if job.GetSpentUsdMicros() != 40_000 || job.GetWallet().GetUsdRemainingMicros() != 1_000_000-40_000 {
		t.Errorf("spent %d, left %d; want 40000 spent (4 runs), 960000 left", job.GetSpentUsdMicros(), job.GetWallet().GetUsdRemainingMicros())
	}
	// Each arrival back at a stage is its next visit: the package says so and where from.
	second := e.sort.got[1]
	if second.GetVisit() != 1 || second.GetOrigin().GetStage() != "resort" || second.GetOrigin().GetRoute().GetName() != "sort" {
		t.Errorf("sort's second package: visit %d origin %v; want visit 1 from resort by route sort", second.GetVisit(), second.GetOrigin())
	}
	if e.writes(t) != 0 {
		t.Errorf("%d writes", e.writes(t))
	}
}

// TestRejectedRoleReroutesOnce: sort's runner cannot serve the role (the agent lacks the
// stage's kb.search): the rail reroutes the job once to sort-backup, which completes it.
// When the fallback cannot serve it either, the job escalates REJECTED_ROLE instead of
// rerouting again.
func TestRejectedRoleReroutesOnce(t *testing.T) {
	e := startRouted(t, always("draft"), nil, kb)
	job, evs := e.submit(t, "routed", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	want := []string{"sort->sort-backup:REROUTE", "sort-backup->draft:NEXT", "draft->judge:NEXT", "judge->writeback:PASS", "writeback->end:NEXT"}
	if got := moveList(job); !slices.Equal(got, want) {
		t.Fatalf("moves %v, want %v", got, want)
	}
	if want := map[string]int{"backup": 1, "draft": 1, "judge": 1}; !callsAre(e.agentCalls(), want) {
		t.Fatalf("agent calls %v; want %v (the rejected role ran nothing)", e.agentCalls(), want)
	}
	if o := e.backup.got[0].GetOrigin(); o.GetStage() != "sort" || o.GetMove() != handoffv1.Move_MOVE_REROUTE {
		t.Errorf("the fallback's package origin %v; want rerouted from sort", o)
	}
	if e.writes(t) != 1 {
		t.Errorf("%d writes, want 1", e.writes(t))
	}

	twice := startRouted(t, always("draft"), nil, nil)
	job, evs = twice.submit(t, "routed", "tkt_2", "", twice.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_ROLE ||
		job.GetEscalation().GetStage() != "sort-backup" || !strings.Contains(job.GetEscalation().GetDetail(), "rerouted once already") {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if got := moveList(job); !slices.Equal(got, []string{"sort->sort-backup:REROUTE"}) || job.GetHops() != 2 {
		t.Fatalf("moves %v after %d hops; want one reroute, two hops", got, job.GetHops())
	}
	if n := twice.sort.calls() + twice.backup.calls(); n != 0 {
		t.Fatalf("%d agent runs for rejected roles; want 0", n)
	}
}

// TestRouteToEscalate: a declared route to escalate hands the job to a person, and the
// move is on the run and on its ESCALATED event.
func TestRouteToEscalate(t *testing.T) {
	e := startRouted(t, always("person"), kb, nil)
	job, evs := e.submit(t, "routed", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_ROUTED ||
		job.GetEscalation().GetRoute() != "humans" {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if got := moveList(job); !slices.Equal(got, []string{"sort->escalate:ROUTE(person)"}) {
		t.Fatalf("moves %v", got)
	}
	last := evs[len(evs)-1]
	if last.GetKind() != handoffv1.EventKind_EVENT_KIND_ESCALATED || last.GetTransfer().GetRoute().GetName() != "person" {
		t.Fatalf("last event %v; want ESCALATED carrying the route person", last)
	}
}

func callsAre(got, want map[string]int) bool {
	for k, v := range got {
		if want[k] != v {
			return false
		}
	}
	return true
}
