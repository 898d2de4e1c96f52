package coordinator_test

// Sub-jobs end to end on real gRPC (internal/stack), both stores: a nested run of another
// declared pipeline on the parent's wallet, whose final artifact alone returns.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/coordinator"
)

// innerYAML: gather then work, no writes; the sub-job returns work's note.v1.
const innerYAML = `
name: inner
max_hops: 10
escalation: {route: humans}
stages:
  - {name: gather, input: raw_ticket.v1, output: {type: facts, schema_version: facts.v1}, criteria: [gathered]}
  - {name: work, input: facts.v1, output: {type: note, schema_version: note.v1}, criteria: [worked]}
`

// outerYAML: a subjob stage running inner (its hop cap %d), a judge, a writeback.
const outerYAML = `
name: outer
max_hops: 10
max_revisions: 1
escalation: {route: humans}
tools:
  - {name: crm.patch, access: write, system: crm}
stages:
  - name: sub
    kind: subjob
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    criteria: [returned]
    subjob: {pipeline: inner, objective: "Write the note from the ticket's facts.", output: note.v1, stop: completed, max_hops: %d}
  - {name: polish, input: note.v1, output: {type: note, schema_version: note.v1}, criteria: [polished]}
  - {name: judge, kind: judge, revise: polish, input: note.v1, output: {type: verdict, schema_version: verdict.v1}, criteria: [judged]}
  - {name: writeback, kind: writeback, input: note.v1, writer: {system: crm, target: ledger}, tools: [crm.patch], output: {type: crm_receipt, schema_version: crm_receipt.v1}, criteria: [written]}
`

// subPipelines parses the outer pipeline (its sub-job capped at maxHops) and the inner one it
// runs.
func subPipelines(t *testing.T, maxHops int) map[string]*pipeline.Pipeline {
	t.Helper()
	pls := map[string]*pipeline.Pipeline{}
	for name, y := range map[string]string{"inner.yaml": innerYAML, "outer.yaml": fmt.Sprintf(outerYAML, maxHops)} {
		p, problems, err := pipeline.Parse(name, []byte(y))
		if err != nil || pipeline.HasErrors(problems) {
			t.Fatalf("%s: %v %v", name, err, problems)
		}
		pls[p.Name] = p
	}
	return pls
}

type subEnv struct {
	*env
	gather, work, polish, judge *router
}

func startSub(t *testing.T, s store.Store, maxHops int) *subEnv {
	t.Helper()
	pls := subPipelines(t, maxHops)
	if problems := pipeline.CheckSubJobs(pls); pipeline.HasErrors(problems) {
		t.Fatalf("sub-jobs: %v", problems)
	}
	e := &subEnv{env: &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}},
		gather: &router{name: "gather", out: "facts", spend: 7_000},
		work:   &router{name: "work", out: "note", spend: 11_000},
		polish: &router{name: "polish", out: "note"},
		judge:  &router{name: "judge", spend: 3_000, verdict: handoffv1.Verdict_VERDICT_PASS},
	}
	e.st, e.client = startStack(t, stack.Config{Store: s, Pipelines: pls, Agents: []agentrunner.Agent{e.gather, e.work, e.judge, e.polish}})
	e.input = mustInput(t, e.st)
	return e
}

// TestSubJobSpendsParentWallet: the nested run's two hops and their spend come off the
// parent's one wallet (its packages name the parent's wallet), only its final artifact
// returns to the parent, control comes back to the parent's judge and writeback, and the
// nested run is the parent's child in GetJob and WatchJob.
func TestSubJobSpendsParentWallet(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		e := startSub(t, s, 5)
		job, evs := e.submit(t, "outer", "tkt_1", "", e.defaultBudget)
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}
		// The one wallet: the nested run's spend (7000 + 11000) and the judge's (3000).
		w, err := e.st.Store.WalletFor(context.Background(), job.GetRunId(), job.GetJobId())
		if err != nil {
			t.Fatal(err)
		}
		if spent := 1_000_000 - w.GetUsdRemainingMicros(); spent != 21_000 || job.GetSpentUsdMicros() != 21_000 {
			t.Errorf("wallet spent %d, run says %d; want 21000 (sub-job 18000 + judge 3000)", spent, job.GetSpentUsdMicros())
		}
		for _, pkg := range append(e.gather.got, e.work.got...) {
			if pkg.GetBudget().GetWalletId() != job.GetRunId() {
				t.Errorf("sub-job package for %s pays from wallet %q, want the parent's %q", pkg.GetStage(), pkg.GetBudget().GetWalletId(), job.GetRunId())
			}
		}
		// Hops: 2 in the nested run, polish, judge and writeback in the parent: 10 - 5 left.
		if w.GetHopsRemaining() != 10-5 {
			t.Errorf("wallet hops left %d, want 5", w.GetHopsRemaining())
		}
		// Only the final artifact returns.
		var types []string
		for _, a := range job.GetArtifacts() {
			types = append(types, a.GetSchemaVersion())
		}
		if slices.Contains(types, "facts.v1") || !slices.Contains(types, "note.v1") {
			t.Errorf("parent artifacts %v: want the sub-job's note.v1 and none of its intermediate facts.v1", types)
		}
		if got := e.judge.got[0].GetArtifacts(); slices.ContainsFunc(got, func(a *handoffv1.Artifact) bool { return a.GetType() == "facts" }) {
			t.Errorf("the parent's judge got the sub-run's intermediate artifacts: %v", got)
		}
		// The child in GetJob and WatchJob.
		if len(job.GetChildren()) != 1 {
			t.Fatalf("children %v, want one", job.GetChildren())
		}
		c := job.GetChildren()[0]
		if c.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || c.GetPipeline() != "inner" || c.GetArtifact().GetSchemaVersion() != "note.v1" || c.GetHops() != 2 {
			t.Errorf("child %v", c)
		}
		var sub []string
		for _, ev := range evs {
			if ev.GetSubRunId() != "" {
				sub = append(sub, strings.TrimPrefix(ev.GetKind().String(), "EVENT_KIND_"))
			}
		}
		if !slices.Equal(sub, []string{"SUBJOB_STARTED", "SUBJOB_ENDED"}) {
			t.Errorf("parent's sub-job events %v", sub)
		}
		childEvs, err := demo.Watch(context.Background(), e.client, c.GetRunId(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(childEvs) == 0 {
			t.Error("WatchJob of the child run streamed nothing")
		}
		if e.writes(t) != 1 {
			t.Errorf("%d writes, want 1", e.writes(t))
		}
	})
}

// TestSubJobEscalationEscalatesParent: the nested run's own hop cap (1) stops it after its
// first hop; its escalation escalates the parent, and nothing is written.
func TestSubJobEscalationEscalatesParent(t *testing.T) {
	e := startSub(t, nil, 1)
	job, evs := e.submit(t, "outer", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_SUBJOB_ESCALATED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if !strings.Contains(job.GetEscalation().GetDetail(), "HOP_CAP") {
		t.Errorf("detail %q does not name the sub-run's cause", job.GetEscalation().GetDetail())
	}
	if c := job.GetChildren(); len(c) != 1 || c[0].GetState() != handoffv1.JobState_JOB_STATE_ESCALATED {
		t.Errorf("children %v", c)
	}
	if e.work.calls() != 0 || e.polish.calls() != 0 || e.writes(t) != 0 {
		t.Errorf("work %d, polish %d, writes %d: want none past the sub-job's cap", e.work.calls(), e.polish.calls(), e.writes(t))
	}
}

// gatedAgent holds every call of its agent until the gate opens.
type gatedAgent struct {
	agentrunner.Agent
	g *gate
}

func (a gatedAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	a.g.waits.Add(1)
	select {
	case <-a.g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return a.Agent.Run(ctx, in)
}

// TestSubJobTakeover: replica A drives a sub-job whose second hop (work) is in flight when A
// is cut off from the store. Replica B takes the parent over, resumes the nested run where it
// was saved (gather is not run again; work's re-sent hop answers DUPLICATE), and the parent
// completes with one write.
func TestSubJobTakeover(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		pls := subPipelines(t, 5)
		g := newGate()
		gather, work := &router{name: "gather", out: "facts"}, &router{name: "work", out: "note"}
		judge := &router{name: "judge", verdict: handoffv1.Verdict_VERDICT_PASS}
		st, _ := startStack(t, stack.Config{Store: s, Pipelines: pls, Agents: []agentrunner.Agent{gather, gatedAgent{work, g}, &router{name: "polish", out: "note"}, judge}})
		t.Cleanup(g.release)
		st.Coordinator.Close()
		opts := replicaOptions(t, st, pls)
		replica := func(owner string, s store.Store) *coordinator.Server { return startReplica(t, opts, owner, s) }
		fa := &faultyStore{Store: st.Store}
		a := replica("replica-a", fa)
		resp, err := a.SubmitJob(ctx, &handoffv1.SubmitJobRequest{JobId: "tkt_1", RequestId: "tkt_1", Pipeline: "outer", Goal: "g",
			Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, Inputs: []*handoffv1.Artifact{mustInput(t, st)}})
		if err != nil {
			t.Fatal(err)
		}
		runID := resp.GetJob().GetRunId()
		for deadline := time.Now().Add(15 * time.Second); g.waits.Load() < 1; {
			if time.Now().After(deadline) {
				t.Fatal("the sub-job's work hop never started")
			}
			time.Sleep(10 * time.Millisecond)
		}
		fa.down.Store(true) // A is as good as killed
		replica("replica-b", st.Store)
		g.release()
		job := runEnded(t, st.Store, runID, func(job *handoffv1.Job) string { return fmt.Sprintf("after the takeover (stage %s)", job.GetStage()) })
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || len(job.GetChildren()) != 1 || job.GetChildren()[0].GetArtifact() == nil {
			t.Fatalf("state %s escalation %v children %v", job.GetState(), job.GetEscalation(), job.GetChildren())
		}
		// Resumed where it was saved: gather's hop is in the nested run's timeline once.
		cevs, err := st.Store.Events(ctx, job.GetChildren()[0].GetRunId(), 0)
		if err != nil {
			t.Fatal(err)
		}
		var acks []string
		for _, ev := range cevs {
			if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK {
				acks = append(acks, ev.GetStage()+":"+strings.TrimPrefix(ev.GetAck().GetStatus().String(), "ACK_STATUS_"))
			}
		}
		if !slices.Equal(acks, []string{"gather:ACCEPTED", "work:DUPLICATE"}) {
			t.Errorf("nested run acks %v, want gather:ACCEPTED (A's, not re-sent) then work:DUPLICATE (B's re-sent hop)", acks)
		}
		if gather.calls() != 1 || work.calls() != 1 {
			t.Errorf("gather ran %d times, work %d; want 1 each (the nested run resumed, its re-sent hop answered DUPLICATE)", gather.calls(), work.calls())
		}
		es, err := st.Store.LedgerEntries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != 1 {
			t.Errorf("%d writes, want 1", len(es))
		}
	})
}

// debitBlip refuses the first Debit of exactly usd µUSD (a store blip at that debit).
type debitBlip struct {
	store.Store
	usd     int64
	refused atomic.Bool
}

func (d *debitBlip) Debit(ctx context.Context, id string, db store.Debit) (*handoffv1.Budget, error) {
	if db.USDMicros == d.usd && d.refused.CompareAndSwap(false, true) {
		return nil, errors.New("debitBlip: store unreachable for a moment")
	}
	return d.Store.Debit(ctx, id, db)
}

// TestNestedStepFailureDropsItsEvents: a nested run's hop records its ACK for the nested
// run's next save, then its spend's debit fails and the parent's step ends with the error.
// The nested hop is repeated from the nested run as saved (answered DUPLICATE), and the
// nested timeline holds the repeat's outcome only, not the ACCEPTED ack of the attempt that
// was never saved (as TestFailedSaveDropsItsEvents for a run of its own).
func TestNestedStepFailureDropsItsEvents(t *testing.T) {
	bolt, err := store.Open(t.TempDir() + "/n.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	db := &debitBlip{Store: bolt, usd: 7_000} // gather's spend
	e := startSub(t, db, 5)
	job, evs := e.submit(t, "outer", "tkt_1", "", e.defaultBudget)
	if !db.refused.Load() {
		t.Fatal("the gather spend's debit was never refused")
	}
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if len(job.GetChildren()) != 1 {
		t.Fatalf("children %v", job.GetChildren())
	}
	cevs, err := bolt.Events(context.Background(), job.GetChildren()[0].GetRunId(), 0)
	if err != nil {
		t.Fatal(err)
	}
	tl := kinds(cevs)
	if n := count(tl, "gather:ACK:ACCEPTED"); n != 0 {
		t.Errorf("the nested timeline holds %d ACCEPTED acks of the gather attempt whose step failed; want none (only the repeat's DUPLICATE)", n)
	}
}
