package coordinator_test

// Fan-out and fan-in end to end, on real gRPC over loopback (internal/stack), against the
// embedded store and a real Redis: one wallet across concurrent branches, a merge that runs
// once per set of branch results, and each declared branch-failure policy.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/coordinator"
)

// fanYAML is a pipeline of one parallel stage with n one-stage branches (b1..bn, stages
// s1..sn, each owning output type o<i>), a merge that judges, and a writeback.
func fanYAML(n int, policy, walletEmpty, timeout string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: fan\nmax_hops: 20\non_wallet_empty: %s\nescalation: {route: humans}\n", walletEmpty)
	b.WriteString("tools:\n  - {name: crm.patch, access: write, system: crm}\n")
	fmt.Fprintf(&b, "stages:\n  - name: lookups\n    kind: parallel\n    input: raw_ticket.v1\n    on_branch_failure: %s\n    branch_timeout: %s\n    branches:\n", policy, timeout)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "      - name: b%d\n        outputs: [o%d]\n        stages:\n          - {name: s%d, input: raw_ticket.v1, output: {type: o%d, schema_version: o%d.v1}, criteria: [found]}\n", i, i, i, i, i)
	}
	b.WriteString(`  - name: merge
    kind: merge
    judge: true
    output: {type: brief, schema_version: brief.v1}
    criteria: [complete]
  - name: writeback
    kind: writeback
    input: brief.v1
    writer: {system: crm, target: ledger}
    tools: [crm.patch]
    output: {type: crm_receipt, schema_version: crm_receipt.v1}
    criteria: [written]
`)
	return b.String()
}

// branchAgent is one branch's scripted agent. It waits at barrier (when set) until that
// many branch agents are running at once, blocks until its context ends when hang is set,
// and fails when fail is set.
type branchAgent struct {
	name    string
	barrier *barrier
	hang    bool
	fail    bool
	release chan struct{}
	gate    *gate // when set, every call waits for it

	mu    sync.Mutex
	calls int
}

func (a *branchAgent) Card() agentrunner.RoleCard { return agentrunner.RoleCard{Name: a.name} }

func (a *branchAgent) n() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

func (a *branchAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	a.mu.Lock()
	a.calls++
	a.mu.Unlock()
	if a.gate != nil {
		a.gate.waits.Add(1)
		select {
		case <-a.gate.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if a.barrier != nil {
		if err := a.barrier.wait(ctx); err != nil {
			return nil, err
		}
	}
	if a.hang {
		// The runner does not cancel an agent because its caller went away; the test
		// releases it at its end.
		select {
		case <-ctx.Done():
		case <-a.release:
		}
		return nil, errors.New("hung")
	}
	if a.fail {
		return nil, errors.New("the lookup service is down")
	}
	typ := "o" + strings.TrimPrefix(a.name, "s")
	art, err := in.Artifacts.Put(ctx, artifact.Ref{JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: typ, SchemaVersion: typ + ".v1", MediaType: "text/plain"}, []byte(a.name+" result"))
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{art}, SpentUsdMicros: 1000}, nil
}

// barrier lets its waiters go once n of them are waiting.
type barrier struct {
	mu   sync.Mutex
	n    int
	open chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, open: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	b.n--
	if b.n == 0 {
		close(b.open)
	}
	b.mu.Unlock()
	select {
	case <-b.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mergeAgent is the merge judge: it records the branch results it got and passes.
type mergeAgent struct {
	mu  sync.Mutex
	got [][]*handoffv1.BranchResult
}

func (m *mergeAgent) Card() agentrunner.RoleCard { return agentrunner.RoleCard{Name: "merge"} }

func (m *mergeAgent) calls() [][]*handoffv1.BranchResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.got)
}

func (m *mergeAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	m.mu.Lock()
	m.got = append(m.got, proto.Clone(in.Package).(*handoffv1.HandoffPackage).GetBranchResults())
	m.mu.Unlock()
	var names []string
	for _, r := range in.Package.GetBranchResults() {
		names = append(names, r.GetBranch())
	}
	art, err := in.Artifacts.Put(ctx, artifact.Ref{JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: "brief", SchemaVersion: "brief.v1", MediaType: "text/plain"}, []byte("brief of "+strings.Join(names, ",")))
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{art}, SpentUsdMicros: 2000,
		Evaluator: &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: in.Round + 1}}, nil
}

type fanEnv struct {
	*env
	branches []*branchAgent
	merge    *mergeAgent
}

func startFan(t *testing.T, s store.Store, yaml string, branches []*branchAgent, with ...func(*stack.Config)) *fanEnv {
	t.Helper()
	p, problems, err := pipeline.Parse("fan.yaml", []byte(yaml))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("fan pipeline: %v %v", err, problems)
	}
	e := &fanEnv{env: &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}, branches: branches, merge: &mergeAgent{}}
	agents := []agentrunner.Agent{e.merge}
	for _, b := range branches {
		agents = append(agents, b)
	}
	cfg := stack.Config{Store: s, Pipelines: map[string]*pipeline.Pipeline{p.Name: p}, Agents: agents}
	for _, f := range with {
		f(&cfg)
	}
	e.st, e.client = startStack(t, cfg)
	release := make(chan struct{})
	for _, b := range branches {
		b.release = release
	}
	t.Cleanup(func() { close(release) }) // before the stack closes: a hung agent ends
	e.input = mustInput(t, e.st)
	return e
}

func agentsNamed(n int) []*branchAgent {
	var out []*branchAgent
	for i := 1; i <= n; i++ {
		out = append(out, &branchAgent{name: fmt.Sprintf("s%d", i)})
	}
	return out
}

func branchStatuses(job *handoffv1.Job) map[string]handoffv1.BranchStatus {
	out := map[string]handoffv1.BranchStatus{}
	for _, b := range job.GetBranches() {
		out[b.GetBranch()] = b.GetStatus()
	}
	return out
}

// onDeliver is a runner client that calls f as each Deliver goes out.
type onDeliver struct {
	handoffv1.AgentRunnerServiceClient
	f func()
}

func (c onDeliver) Deliver(ctx context.Context, req *handoffv1.DeliverRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[handoffv1.DeliverResponse], error) {
	c.f()
	return c.AgentRunnerServiceClient.Deliver(ctx, req, opts...)
}

func acksBy(evs []*handoffv1.JobEvent, status handoffv1.AckStatus) int {
	n := 0
	for _, ev := range evs {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK && ev.GetBranch() != "" && ev.GetAck().GetStatus() == status {
			n++
		}
	}
	return n
}

// TestFanOutOneWallet: five branches start at once on a wallet that allows three hops. The
// runner admits exactly three (each debit in the same store round trip as the stage's
// claim), refuses two with REJECTED_BUDGET, and the wallet ends at zero, never below. The
// three admitted hops are all in flight at once (the barrier lets none go before the third
// arrives) and finish (on_wallet_empty: finish_in_flight): their results are kept; then the
// job escalates WALLET_EMPTY and nothing is merged or written. The admitted agents start
// only once all five hops went out: a branch that reaches its send after the admitted hops
// came back sees the empty wallet and stops unsent, which is right too, but leaves no
// refusal for this test to count.
func TestFanOutOneWallet(t *testing.T) {
	const n, k = 5, 3
	eachStore(t, func(t *testing.T, s store.Store) {
		agents := agentsNamed(n)
		bar, sentAll := newBarrier(k), newGate()
		for _, a := range agents {
			a.barrier, a.gate = bar, sentAll
		}
		var sent atomic.Int32
		e := startFan(t, s, fanYAML(n, "escalate", "finish_in_flight", "1m"), agents, func(c *stack.Config) {
			c.WrapRunner = func(c handoffv1.AgentRunnerServiceClient) handoffv1.AgentRunnerServiceClient {
				return onDeliver{c, func() {
					if sent.Add(1) == n {
						sentAll.release()
					}
				}}
			}
		})
		job, evs := e.submit(t, "fan", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: k})

		if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY {
			t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}
		calls := 0
		for _, a := range agents {
			calls += a.n()
		}
		if calls != k {
			t.Errorf("branch agents ran %d times, want exactly %d", calls, k)
		}
		if got := acksBy(evs, handoffv1.AckStatus_ACK_STATUS_ACCEPTED); got != k {
			t.Errorf("%d branch hops ACCEPTED, want %d", got, k)
		}
		if got := acksBy(evs, handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET); got != n-k {
			t.Errorf("%d branch hops REJECTED_BUDGET, want %d", got, n-k)
		}
		w, err := e.st.Store.WalletFor(context.Background(), job.GetRunId(), job.GetJobId())
		if err != nil {
			t.Fatal(err)
		}
		if w.GetHopsRemaining() != 0 || job.GetWallet().GetHopsRemaining() != 0 {
			t.Errorf("wallet hops left: store %d, run %d; want 0", w.GetHopsRemaining(), job.GetWallet().GetHopsRemaining())
		}
		if w.GetUsdRemainingMicros() != 1_000_000-k*1000 || job.GetSpentUsdMicros() != k*1000 {
			t.Errorf("wallet usd left %d, spent %d; want the %d admitted hops' spend only", w.GetUsdRemainingMicros(), job.GetSpentUsdMicros(), k)
		}
		completed, stopped := 0, 0
		for _, st := range branchStatuses(job) {
			switch st {
			case handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED:
				completed++
			case handoffv1.BranchStatus_BRANCH_STATUS_STOPPED:
				stopped++
			}
		}
		if completed != k || stopped != n-k {
			t.Errorf("branches %v: want %d completed (the hops in flight finished), %d stopped", branchStatuses(job), k, n-k)
		}
		if len(e.merge.calls()) != 0 || e.writes(t) != 0 {
			t.Errorf("merge ran %d times, %d writes; want none", len(e.merge.calls()), e.writes(t))
		}
	})
}

// TestFanOutWalletStopCancels: with on_wallet_empty: stop, the refused hop cancels the hops
// still in flight: the job escalates WALLET_EMPTY and no branch completes.
func TestFanOutWalletStopCancels(t *testing.T) {
	agents := agentsNamed(3)
	for _, a := range agents {
		a.hang = true // only a cancel ends them
	}
	e := startFan(t, nil, fanYAML(3, "escalate", "stop", "1m"), agents)
	job, evs := e.submit(t, "fan", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 2})
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	for b, st := range branchStatuses(job) {
		if st == handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED {
			t.Errorf("branch %s completed; want every hop in flight cancelled", b)
		}
	}
}

// TestFanOutMergesOnce: three branches complete, the merge gets every result keyed by
// branch and the job writes once. The same job submitted again re-delivers every branch
// (each answers DUPLICATE with its first result) and the merge, whose key names that same
// set of results: it answers DUPLICATE too, so there is no second merge and no second write.
func TestFanOutMergesOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		e := startFan(t, s, fanYAML(3, "escalate", "finish_in_flight", "1m"), agentsNamed(3))
		job, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}
		merges := e.merge.calls()
		if len(merges) != 1 {
			t.Fatalf("merge ran %d times, want 1", len(merges))
		}
		var got []string
		for _, r := range merges[0] {
			got = append(got, fmt.Sprintf("%s:%s", r.GetBranch(), r.GetArtifacts()[0].GetSchemaVersion()))
		}
		slices.Sort(got)
		if want := []string{"b1:o1.v1", "b2:o2.v1", "b3:o3.v1"}; !slices.Equal(got, want) {
			t.Errorf("merge got %v, want %v", got, want)
		}
		if e.writes(t) != 1 {
			t.Fatalf("%d writes, want 1", e.writes(t))
		}

		again, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
		if again.GetRunId() == job.GetRunId() || again.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("repeat run %s state %s; timeline %v", again.GetRunId(), again.GetState(), kinds(evs))
		}
		if got := acksBy(evs, handoffv1.AckStatus_ACK_STATUS_DUPLICATE); got != 3 {
			t.Errorf("%d branch hops DUPLICATE on the repeat, want 3", got)
		}
		for _, a := range e.branches {
			if a.n() != 1 {
				t.Errorf("branch agent %s ran %d times, want 1", a.name, a.n())
			}
		}
		if len(e.merge.calls()) != 1 || e.writes(t) != 1 {
			t.Errorf("after the repeat: merge ran %d times, %d writes; want 1 and 1", len(e.merge.calls()), e.writes(t))
		}
	})
}

// TestBranchFailurePolicies: one of two branches fails; the stage's on_branch_failure says
// what follows.
func TestBranchFailurePolicies(t *testing.T) {
	tests := []struct {
		policy     string
		state      handoffv1.JobState
		cause      handoffv1.EscalationCause
		merged     []string // the branches the merge got; nil: no merge
		writes     int
		wantDetail string
	}{
		{policy: "escalate", state: handoffv1.JobState_JOB_STATE_ESCALATED, cause: handoffv1.EscalationCause_ESCALATION_CAUSE_BRANCH_FAILED, wantDetail: "b2"},
		{policy: "fail", state: handoffv1.JobState_JOB_STATE_FAILED, wantDetail: "on_branch_failure: fail"},
		{policy: "continue_without", state: handoffv1.JobState_JOB_STATE_COMPLETED, merged: []string{"b1"}, writes: 1},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			eachStore(t, func(t *testing.T, s store.Store) {
				agents := agentsNamed(2)
				agents[1].fail = true
				e := startFan(t, s, fanYAML(2, tt.policy, "finish_in_flight", "1m"), agents)
				job, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
				if job.GetState() != tt.state || job.GetEscalation().GetCause() != tt.cause {
					t.Fatalf("state %s escalation %v; want %s %s; timeline %v", job.GetState(), job.GetEscalation(), tt.state, tt.cause, kinds(evs))
				}
				if !strings.Contains(job.GetEscalation().GetDetail(), tt.wantDetail) {
					t.Errorf("detail %q, want it to contain %q", job.GetEscalation().GetDetail(), tt.wantDetail)
				}
				if st := branchStatuses(job); st["b1"] != handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED || st["b2"] != handoffv1.BranchStatus_BRANCH_STATUS_FAILED {
					t.Errorf("branches %v: want b1 completed, b2 failed", st)
				}
				var merged []string
				for _, call := range e.merge.calls() {
					for _, r := range call {
						merged = append(merged, r.GetBranch())
					}
				}
				if !slices.Equal(merged, tt.merged) || e.writes(t) != tt.writes {
					t.Errorf("merged %v, %d writes; want %v, %d", merged, e.writes(t), tt.merged, tt.writes)
				}
			})
		})
	}
}

// TestBranchTimeout: a branch that never answers is ended at its branch_timeout, so it does
// not block the merge forever: TIMED_OUT, and the default policy escalates.
func TestBranchTimeout(t *testing.T) {
	agents := agentsNamed(2)
	agents[0].hang = true
	e := startFan(t, nil, fanYAML(2, "escalate", "finish_in_flight", "300ms"), agents)
	job, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_BRANCH_FAILED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if st := branchStatuses(job); st["b1"] != handoffv1.BranchStatus_BRANCH_STATUS_TIMED_OUT || st["b2"] != handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED {
		t.Errorf("branches %v: want b1 timed out, b2 completed", st)
	}
	if !strings.Contains(job.GetEscalation().GetDetail(), "timeout") {
		t.Errorf("detail %q does not say timeout", job.GetEscalation().GetDetail())
	}
}

// TestFanOutTakeoverRunsOnlyUnfinishedBranches: replica A drives a fan-out of three
// branches; b1 and b2 complete and are saved, b3's hop is in flight when A is cut off from
// the store (as a killed coordinator is). Replica B takes the run over once A's lease lapses
// and resumes only b3: b1 and b2 are never delivered again (one ACK each in the run's
// events), b3's re-sent hop answers DUPLICATE (its agent had finished), and the merge and
// the write happen once.
func TestFanOutTakeoverRunsOnlyUnfinishedBranches(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := context.Background()
		agents := agentsNamed(3)
		g := newGate()
		agents[2].gate = g
		p, problems, err := pipeline.Parse("fan.yaml", []byte(fanYAML(3, "escalate", "finish_in_flight", "1m")))
		if err != nil || pipeline.HasErrors(problems) {
			t.Fatalf("fan pipeline: %v %v", err, problems)
		}
		pls := map[string]*pipeline.Pipeline{p.Name: p}
		merge := &mergeAgent{}
		st, _ := startStack(t, stack.Config{Store: s, Pipelines: pls, Agents: []agentrunner.Agent{merge, agents[0], agents[1], agents[2]}})
		t.Cleanup(g.release)
		st.Coordinator.Close() // the test's replicas are the only coordinators
		opts := replicaOptions(t, st, pls)
		replica := func(owner string, s store.Store) *coordinator.Server { return startReplica(t, opts, owner, s) }
		fa := &faultyStore{Store: st.Store}
		a := replica("replica-a", fa)
		input := mustInput(t, st)
		resp, err := a.SubmitJob(ctx, &handoffv1.SubmitJobRequest{JobId: "tkt_1", RequestId: "tkt_1", Pipeline: "fan", Goal: "g",
			Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, Inputs: []*handoffv1.Artifact{input}})
		if err != nil {
			t.Fatal(err)
		}
		runID := resp.GetJob().GetRunId()
		// Wait until b1 and b2 are saved COMPLETED and b3's agent is running.
		deadline := time.Now().Add(15 * time.Second)
		for {
			j, err := st.Store.GetRun(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}
			bs := branchStatuses(j)
			if bs["b1"] == handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED && bs["b2"] == handoffv1.BranchStatus_BRANCH_STATUS_COMPLETED && g.waits.Load() == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("branches %v, b3 waiting %d: the fan-out did not reach the cut", bs, g.waits.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		fa.down.Store(true) // A can no longer save or renew: as good as killed
		replica("replica-b", st.Store)
		g.release() // b3's agent finishes; A cannot record it
		job := runEnded(t, st.Store, runID, func(job *handoffv1.Job) string {
			return fmt.Sprintf("after the takeover: branches %v", branchStatuses(job))
		})
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("state %s escalation %v", job.GetState(), job.GetEscalation())
		}
		evs, err := st.Store.Events(ctx, runID, 0)
		if err != nil {
			t.Fatal(err)
		}
		acks := map[string][]string{}
		for _, ev := range evs {
			if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK && ev.GetBranch() != "" {
				acks[ev.GetStage()] = append(acks[ev.GetStage()], strings.TrimPrefix(ev.GetAck().GetStatus().String(), "ACK_STATUS_"))
			}
		}
		if !slices.Equal(acks["s1"], []string{"ACCEPTED"}) || !slices.Equal(acks["s2"], []string{"ACCEPTED"}) {
			t.Errorf("branch acks %v: completed branches b1, b2 must be delivered once, never re-run", acks)
		}
		if !slices.Equal(acks["s3"], []string{"DUPLICATE"}) {
			t.Errorf("b3 acks %v: want B's re-sent hop only, answered DUPLICATE", acks["s3"])
		}
		for _, ag := range agents {
			if ag.n() != 1 {
				t.Errorf("agent %s ran %d times, want 1", ag.name, ag.n())
			}
		}
		es, err := st.Store.LedgerEntries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(merge.calls()) != 1 || len(es) != 1 {
			t.Errorf("merge ran %d times, %d writes; want 1 and 1", len(merge.calls()), len(es))
		}
	})
}

// TestFanOutBranchGetsDeclaredVersion: a branch hop is sent the newest version its agent
// declares, as any hop is: b1's agent declares handoff.v2 and is sent v2, b2's v1 only.
func TestFanOutBranchGetsDeclaredVersion(t *testing.T) {
	agents := agentsNamed(2)
	p, problems, err := pipeline.Parse("fan.yaml", []byte(fanYAML(2, "escalate", "finish_in_flight", "1m")))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("fan pipeline: %v %v", err, problems)
	}
	v2 := newSpy(agents[0], contract.V1, contract.V2)
	v1 := newSpy(agents[1], contract.V1)
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.st, e.client = startStack(t, stack.Config{Pipelines: map[string]*pipeline.Pipeline{p.Name: p}, Agents: []agentrunner.Agent{&mergeAgent{}, v2, v1}})
	e.input = mustInput(t, e.st)
	job, evs := e.submit(t, "fan", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	v2.mu.Lock()
	defer v2.mu.Unlock()
	v1.mu.Lock()
	defer v1.mu.Unlock()
	if len(v2.v2) != 1 || v2.v2[0] == nil {
		t.Errorf("b1's agent declares handoff.v2 but was sent %v", v2.v2)
	}
	if len(v1.v2) != 1 || v1.v2[0] != nil {
		t.Errorf("b2's agent declares handoff.v1 only but was sent v2")
	}
}

// TestFanOutAfterCarriedMove: a stage without a verdict before a parallel stage carries its
// move, and the fan-out saves it before any branch package goes out: each branch's agent
// finds the run at the parallel stage, the stage before counted and recorded.
func TestFanOutAfterCarriedMove(t *testing.T) {
	yaml := strings.Replace(fanYAML(2, "escalate", "finish_in_flight", "1m"),
		"stages:\n  - name: lookups\n    kind: parallel\n    input: raw_ticket.v1\n",
		"stages:\n  - {name: intake, input: raw_ticket.v1, output: {type: note, schema_version: note.v1}, criteria: [read]}\n  - name: lookups\n    kind: parallel\n    input: note.v1\n", 1)
	p, problems, err := pipeline.Parse("fan.yaml", []byte(yaml))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("pipeline: %v %v", err, problems)
	}
	s, err := store.Open(t.TempDir() + "/fan.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b1 := &peeker{Agent: &branchAgent{name: "s1"}, st: s}
	e := &fanEnv{env: &env{}, merge: &mergeAgent{}}
	e.st, e.client = startStack(t, stack.Config{Store: s, Pipelines: map[string]*pipeline.Pipeline{p.Name: p},
		Agents: []agentrunner.Agent{&recorder{name: "intake"}, b1, &branchAgent{name: "s2"}, e.merge}})
	e.input = mustInput(t, e.st)
	job, evs := e.submit(t, "fan", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	b1.sawRun(t, "lookups", 1, "intake:ACK:ACCEPTED", "intake:STAGE_RESULT")
}
