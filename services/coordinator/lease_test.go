package coordinator_test

// Run leases across replicas: several coordinator.Servers on one store, as several
// coordinator processes share one Redis.

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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/coordinator"
)

// faultyStore is a store that can be cut off, as a replica partitioned from Redis sees it.
type faultyStore struct {
	store.Store
	down atomic.Bool
}

var errCut = errors.New("faulty store: unreachable")

func (f *faultyStore) cut() error {
	if f.down.Load() {
		return errCut
	}
	return nil
}

func (f *faultyStore) CreateRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, error) {
	if err := f.cut(); err != nil {
		return nil, false, err
	}
	return f.Store.CreateRun(ctx, j, evs...)
}
func (f *faultyStore) GetRun(ctx context.Context, id string) (*handoffv1.Job, error) {
	if err := f.cut(); err != nil {
		return nil, err
	}
	return f.Store.GetRun(ctx, id)
}
func (f *faultyStore) PutRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	if err := f.cut(); err != nil {
		return err
	}
	return f.Store.PutRun(ctx, j, evs...)
}
func (f *faultyStore) PutRunFenced(ctx context.Context, j *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	if err := f.cut(); err != nil {
		return err
	}
	return f.Store.PutRunFenced(ctx, j, epoch, evs...)
}

func (f *faultyStore) FenceRun(ctx context.Context, id string) (uint64, error) {
	if err := f.cut(); err != nil {
		return 0, err
	}
	return f.Store.FenceRun(ctx, id)
}

func (f *faultyStore) ListRuns(ctx context.Context, st handoffv1.JobState, limit int, after string) ([]*handoffv1.Job, string, error) {
	if err := f.cut(); err != nil {
		return nil, "", err
	}
	return f.Store.ListRuns(ctx, st, limit, after)
}
func (f *faultyStore) AppendEvent(ctx context.Context, id string, ev *handoffv1.JobEvent) (uint64, error) {
	if err := f.cut(); err != nil {
		return 0, err
	}
	return f.Store.AppendEvent(ctx, id, ev)
}
func (f *faultyStore) OpenWallet(ctx context.Context, id, job string, b *handoffv1.Budget) (*handoffv1.Budget, error) {
	if err := f.cut(); err != nil {
		return nil, err
	}
	return f.Store.OpenWallet(ctx, id, job, b)
}
func (f *faultyStore) Debit(ctx context.Context, id string, d store.Debit) (*handoffv1.Budget, error) {
	if err := f.cut(); err != nil {
		return nil, err
	}
	return f.Store.Debit(ctx, id, d)
}
func (f *faultyStore) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if err := f.cut(); err != nil {
		return false, err
	}
	return f.Store.AcquireLease(ctx, name, owner, ttl)
}
func (f *faultyStore) ReleaseLease(ctx context.Context, name, owner string) error {
	if err := f.cut(); err != nil {
		return err
	}
	return f.Store.ReleaseLease(ctx, name, owner)
}
func (f *faultyStore) LapsedLeases(ctx context.Context, limit int) ([]string, error) {
	if err := f.cut(); err != nil {
		return nil, err
	}
	return f.Store.LapsedLeases(ctx, limit)
}
func (f *faultyStore) Ping(ctx context.Context) error {
	if err := f.cut(); err != nil {
		return err
	}
	return f.Store.Ping(ctx)
}

// gate holds every agent call while closed.
type gate struct {
	mu     sync.Mutex
	open   chan struct{}
	waits  atomic.Int32 // calls that reached the gate
	closed bool
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		close(g.open)
		g.closed = true
	}
}

// gated is a recorder whose calls wait for the gate.
type gated struct {
	*recorder
	g *gate
}

func (a gated) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	a.g.waits.Add(1)
	select {
	case <-a.g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return a.recorder.Run(ctx, in)
}

// replicas is the relay pipeline's runner and writeback (from internal/stack) with the
// stack's own coordinator stopped, so the test's replicas are the only ones.
type replicas struct {
	st           *stack.Stack
	draft, judge *recorder
	g            *gate
	opts         coordinator.Options
}

func startReplicas(t *testing.T) *replicas {
	t.Helper()
	return startReplicasGated(t, "draft")
}

// startReplicasGated is startReplicas with the gate on the agent of stage gated (draft or
// judge) instead of the draft's.
func startReplicasGated(t *testing.T, gatedStage string) *replicas {
	t.Helper()
	p, problems, err := pipeline.Parse("relay.yaml", []byte(fmt.Sprintf(relay, 10, 2)))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("relay pipeline: %v %v", err, problems)
	}
	r := &replicas{
		draft: &recorder{name: "draft", spend: 100},
		judge: &recorder{name: "judge", spend: 50, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}},
		g:     newGate(),
	}
	pls := map[string]*pipeline.Pipeline{p.Name: p}
	agents := []agentrunner.Agent{gated{r.draft, r.g}, r.judge}
	if gatedStage == "judge" {
		agents = []agentrunner.Agent{r.draft, gated{r.judge, r.g}}
	}
	st, err := stack.Start(context.Background(), stack.Config{
		DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines: pls, Agents: agents, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.Coordinator.Close()
	r.st = st
	r.opts = replicaOptions(t, st, pls)
	return r
}

// replicaOptions are the options of a test replica of pipelines pls that reaches st's runner
// and writeback as the coordinator identity, with a short lease so takeovers come quickly.
func replicaOptions(t *testing.T, st *stack.Stack, pls map[string]*pipeline.Pipeline) coordinator.Options {
	t.Helper()
	rc, err := st.DialAs(st.RunnerAddr, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	wc, err := st.DialAs(st.WritebackAddr, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	val, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	return coordinator.Options{
		Pipelines: pls, Validator: val, Logger: testLogger(t),
		Runner:    handoffv1.NewAgentRunnerServiceClient(rc),
		Writeback: handoffv1.NewWritebackServiceClient(wc),
		LeaseTTL:  600 * time.Millisecond, HopTimeout: 10 * time.Second, RetryFor: 10 * time.Second,
	}
}

// replica starts a coordinator on st named owner, with its takeover scan running.
func (r *replicas) replica(t *testing.T, owner string, st store.Store) *coordinator.Server {
	t.Helper()
	return startReplica(t, r.opts, owner, st)
}

// startReplica starts a coordinator with opts on st named owner, with its takeover scan
// running; it is closed when the test ends.
func startReplica(t *testing.T, opts coordinator.Options, owner string, st store.Store) *coordinator.Server {
	t.Helper()
	o := opts
	o.Store, o.Owner = st, owner
	c, err := coordinator.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if _, err := c.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// runEnded polls runID in s until it is no longer RUNNING and returns it, failing the test
// after 20 s with what says where the run stood.
func runEnded(t *testing.T, s interface {
	GetRun(context.Context, string) (*handoffv1.Job, error)
}, runID string, where func(*handoffv1.Job) string) *handoffv1.Job {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		job, err := s.GetRun(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		if job.GetState() != handoffv1.JobState_JOB_STATE_RUNNING {
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not end: %s", where(job))
		}
	}
}

func (r *replicas) submit(t *testing.T, c *coordinator.Server, jobID string) string {
	t.Helper()
	resp, err := c.SubmitJob(context.Background(), &handoffv1.SubmitJobRequest{
		JobId: jobID, RequestId: jobID, Pipeline: "relay", Goal: "g",
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000},
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetJob().GetRunId()
}

// waitTerminal waits for every run to end and returns them.
func (r *replicas) waitTerminal(t *testing.T, runIDs []string, within time.Duration) []*handoffv1.Job {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var out []*handoffv1.Job
		for _, id := range runIDs {
			j, err := r.st.Store.GetRun(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if s := j.GetState(); s == handoffv1.JobState_JOB_STATE_RUNNING {
				break
			}
			out = append(out, j)
		}
		if len(out) == len(runIDs) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs ended within %s", len(out), len(runIDs), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *replicas) ledger(t *testing.T) map[string]int {
	t.Helper()
	es, err := r.st.Store.LedgerEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for _, e := range es {
		keys[e.Key]++
	}
	return keys
}

// TestTakeoverWhenReplicaCutOff: replica A drives runs whose draft hop is in flight when A
// loses the store. A stops driving them (it cannot renew their leases), the leases expire,
// and replica B takes the runs over, re-sending the hop A had in flight: the runner answers
// that repeat DUPLICATE, so every stage ran once and every job was written once.
func TestTakeoverWhenReplicaCutOff(t *testing.T) {
	r := startReplicas(t)
	fa := &faultyStore{Store: r.st.Store}
	a := r.replica(t, "replica-a", fa)
	var ids []string
	for i := range 4 {
		ids = append(ids, r.submit(t, a, fmt.Sprintf("tkt_%d", i)))
	}
	b := r.replica(t, "replica-b", r.st.Store)
	for r.g.waits.Load() < 4 { // every draft is in flight, on A
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range ids {
		if ok, err := r.st.Store.AcquireLease(context.Background(), "run:"+id, "replica-b", time.Second); err != nil || ok {
			t.Fatalf("B took run %s's lease while A holds it: %v %v", id, ok, err)
		}
	}
	fa.down.Store(true)
	cut := time.Now()
	r.g.release() // the drafts finish; A cannot record them
	jobs := r.waitTerminal(t, ids, 15*time.Second)
	// B finds the lapsed leases by polling the store's lease index, not by its scan of
	// RUNNING runs (every 10s): the figure is logged, not asserted.
	t.Logf("4 runs cut off from their replica resumed on the other and ended %s after the cut (lease ttl %s)",
		time.Since(cut).Round(time.Millisecond), r.opts.LeaseTTL)
	for _, j := range jobs {
		if j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Errorf("run %s ended %s (%v); want COMPLETED", j.GetRunId(), j.GetState(), j.GetEscalation())
		}
	}
	if r.draft.calls() != 4 || r.judge.calls() != 4 {
		t.Errorf("draft ran %d times, judge %d; want 4 each (the re-sent hop answered DUPLICATE)", r.draft.calls(), r.judge.calls())
	}
	for key, n := range r.ledger(t) {
		if n != 1 {
			t.Errorf("key %s written %d times", key, n)
		}
	}
	if n := len(r.ledger(t)); n != 4 {
		t.Errorf("%d keys written, want 4", n)
	}
	_ = b
	// A, back on the store, finds nothing to drive: the runs ended under B.
	fa.down.Store(false)
	if n, err := a.Resume(context.Background()); err != nil || n != 0 {
		t.Fatalf("A's Resume after the takeover = %d, %v; want 0 runs", n, err)
	}
}

// TestLongHopKeepsLease: a hop that takes many lease ttls keeps its run's lease, renewed in
// the background while the hop is in flight: the other replica, watching for lapsed leases
// all along, never takes the run, and the stage runs once.
func TestLongHopKeepsLease(t *testing.T) {
	r := startReplicas(t)
	a := r.replica(t, "replica-a", r.st.Store)
	id := r.submit(t, a, "tkt_long")
	b := r.replica(t, "replica-b", r.st.Store)
	_ = b
	for r.g.waits.Load() < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	// Five ttls with the draft held: without renewal the lease would lapse three times over.
	for range 10 {
		time.Sleep(r.opts.LeaseTTL / 2)
		if ok, err := r.st.Store.AcquireLease(context.Background(), "run:"+id, "probe", time.Millisecond); err != nil || ok {
			t.Fatalf("the run's lease was free (or unreadable: %v) while its long hop was in flight", err)
		}
	}
	r.g.release()
	if j := r.waitTerminal(t, []string{id}, 15*time.Second)[0]; j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("run ended %s, want COMPLETED", j.GetState())
	}
	if r.draft.calls() != 1 || r.g.waits.Load() != 1 {
		t.Fatalf("draft ran %d times (%d reached the agent); want once: the lease was never lost", r.draft.calls(), r.g.waits.Load())
	}
}

// TestOneReplicaPerRun: two replicas scanning one store, jobs submitted to both: each run
// is driven by one replica only, so no stage runs twice.
func TestOneReplicaPerRun(t *testing.T) {
	r := startReplicas(t)
	r.g.release()
	a := r.replica(t, "replica-a", r.st.Store)
	b := r.replica(t, "replica-b", r.st.Store)
	var ids []string
	for i := range 12 {
		c := a
		if i%2 == 1 {
			c = b
		}
		ids = append(ids, r.submit(t, c, fmt.Sprintf("tkt_%d", i)))
	}
	for _, j := range r.waitTerminal(t, ids, 15*time.Second) {
		if j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || j.GetHops() != 3 {
			t.Errorf("run %s ended %s after %d hops; want COMPLETED after 3", j.GetRunId(), j.GetState(), j.GetHops())
		}
	}
	if r.draft.calls() != 12 || r.judge.calls() != 12 || len(r.ledger(t)) != 12 {
		t.Fatalf("draft %d, judge %d calls, %d writes; want 12 each", r.draft.calls(), r.judge.calls(), len(r.ledger(t)))
	}
}

// TestCloseDrainsAndReleases: Close lets the hop in flight finish and be saved, starts no
// new hop, and releases the run's lease so another replica can take it at once.
func TestCloseDrainsAndReleases(t *testing.T) {
	r := startReplicas(t)
	a := r.replica(t, "replica-a", r.st.Store)
	id := r.submit(t, a, "tkt_1")
	for r.g.waits.Load() < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-closed:
		t.Fatal("Close returned while a hop was in flight")
	default:
	}
	if _, err := a.SubmitJob(context.Background(), &handoffv1.SubmitJobRequest{JobId: "tkt_2", Pipeline: "relay", Goal: "g", Budget: &handoffv1.Budget{UsdRemainingMicros: 1}}); err == nil {
		t.Fatal("SubmitJob while draining succeeded")
	}
	r.g.release()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the hop finished")
	}
	j, err := r.st.Store.GetRun(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j.GetState() != handoffv1.JobState_JOB_STATE_RUNNING || j.GetStage() != "judge" || j.GetHops() != 1 {
		t.Fatalf("after drain: %s at %s after %d hops; want RUNNING at judge after 1 (the draft saved, no new hop)", j.GetState(), j.GetStage(), j.GetHops())
	}
	if ok, err := r.st.Store.AcquireLease(context.Background(), "run:"+id, "replica-b", time.Second); err != nil || !ok {
		t.Fatalf("lease after drain: %v %v; want it free", ok, err)
	}
	r.st.Store.ReleaseLease(context.Background(), "run:"+id, "replica-b")
	b := r.replica(t, "replica-b", r.st.Store) // its first scan takes the run over
	_ = b
	if j := r.waitTerminal(t, []string{id}, 10*time.Second)[0]; j.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("run ended %s under B, want COMPLETED", j.GetState())
	}
}

// TestStoreHealth: health follows the store's Ping, for the server and the service.
func TestStoreHealth(t *testing.T) {
	p := &flakyPinger{}
	hs := health.NewServer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc := handoffv1.CoordinatorService_ServiceDesc.ServiceName
	go rpc.WatchStoreHealth(ctx, p, hs, []string{"", svc}, 20*time.Millisecond, testLogger(t))
	want := func(s healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			a, _ := hs.Check(ctx, &healthpb.HealthCheckRequest{Service: ""})
			b, _ := hs.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if a.GetStatus() == s && b.GetStatus() == s {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %v / %v, want %v", a.GetStatus(), b.GetStatus(), s)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	p.down.Store(true)
	want(healthpb.HealthCheckResponse_NOT_SERVING)
	p.down.Store(false)
	want(healthpb.HealthCheckResponse_SERVING)
	hs.Shutdown() // draining: stays NOT_SERVING whatever the store does
	time.Sleep(60 * time.Millisecond)
	want(healthpb.HealthCheckResponse_NOT_SERVING)
}

type flakyPinger struct{ down atomic.Bool }

func (p *flakyPinger) Ping(context.Context) error {
	if p.down.Load() {
		return errors.New("redis 127.0.0.1:1: dial tcp: connection refused")
	}
	return nil
}

// railPays makes the replicas' runner a receiver that debits nothing, as an agent runner
// of another language behind a stage's runner: address is (its acks carry no wallet, so the
// rail pays each agent hop itself): its packages name no wallet_id. (The Go runner with a
// store of its own refuses a wallet_id it does not hold, REJECTED_BUDGET.)
func (r *replicas) railPays() {
	r.opts.Tamper = func(p *handoffv1.HandoffPackage) { p.GetBudget().WalletId = "" }
}

// TestRepeatedStepRailPaidOnce: with a runner that does not debit the hop (the rail pays
// each agent hop itself, railPays), a step whose save failed is repeated without paying its
// hop a second time.
func TestRepeatedStepRailPaidOnce(t *testing.T) {
	r := startReplicas(t)
	r.g.release()
	r.railPays()
	wl := newWriteLog(t, t.TempDir()) // the coordinator's own store, not the runner's
	draft := "draft"
	wl.failStage.Store(&draft)
	c := r.replica(t, "a", wl)
	runID := r.submit(t, c, "tkt_rail")
	job := runEnded(t, wl, runID, func(j *handoffv1.Job) string { return "still " + j.GetState().String() })
	if wl.failStage.Load() != nil {
		t.Fatal("the draft's save was never refused")
	}
	w, err := wl.Wallet(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || job.GetHops() != 3 || w.GetHopsRemaining() != 10-3 {
		t.Fatalf("run %s after %d hops, wallet %d hops left; want COMPLETED after 3, 7 left (each hop paid once)", job.GetState(), job.GetHops(), w.GetHopsRemaining())
	}
}

// TestApproveFailedThenReturnPaysEveryHop: an approve whose decision could not be saved has
// not taken effect: it pays nothing, leaves no RESOLVED event, and the run stays at its
// escalation, so the person can still return it to a stage; every later hop is paid once
// (the rail pays them: railPays).
func TestApproveFailedThenReturnPaysEveryHop(t *testing.T) {
	r := startReplicas(t)
	r.g.release()
	r.railPays()
	F, P := handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS
	r.judge.verdicts = []handoffv1.Verdict{F, F, F, P}
	wl := newWriteLog(t, t.TempDir())
	c := r.replica(t, "a", wl)
	runID := r.submit(t, c, "tkt_back")
	ctx := context.Background()
	waitFor := func(want handoffv1.JobState) *handoffv1.Job {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			job, err := wl.GetRun(ctx, runID)
			if err != nil {
				t.Fatal(err)
			}
			if job.GetState() == want {
				return job
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s, want %s", job.GetState(), want)
			}
		}
	}
	if job := waitFor(handoffv1.JobState_JOB_STATE_ESCALATED); job.GetHops() != 6 {
		t.Fatalf("escalated after %d hops, want 6 (three drafts, three FAILs)", job.GetHops())
	}
	writeback := "writeback"
	wl.failStage.Store(&writeback)
	if _, err := c.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: runID, Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{}}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("approve with its save refused = %v; want Unavailable", err)
	}
	if job := waitFor(handoffv1.JobState_JOB_STATE_ESCALATED); job.GetHops() != 6 || job.GetResolution() != nil {
		t.Fatalf("after the refused approve: %d hops, resolution %v; want the run untouched", job.GetHops(), job.GetResolution())
	}
	evs, err := wl.Events(ctx, runID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if k := kinds(evs); slices.ContainsFunc(k, func(s string) bool { return strings.HasSuffix(s, ":RESOLVED") }) {
		t.Fatalf("a RESOLVED event was written for a decision that did not take effect: %v", k)
	}
	if _, err := c.ResolveEscalation(ctx, &handoffv1.ResolveEscalationRequest{RunId: runID, Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft", Grant: oneRevision}}}); err != nil {
		t.Fatal(err)
	}
	job := waitFor(handoffv1.JobState_JOB_STATE_COMPLETED)
	w, err := wl.Wallet(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	// 9 hops made: 6, then draft, judge, writeback; the refused approve paid none.
	if job.GetHops() != 9 || w.GetHopsRemaining() != 1 {
		t.Fatalf("run ended after %d hops with %d left in the wallet; want 9 hops and 1 left", job.GetHops(), w.GetHopsRemaining())
	}
}
