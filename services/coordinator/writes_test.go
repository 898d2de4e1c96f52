package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// writeLog records the writes the platform makes to its store.
type writeLog struct {
	store.Store
	mu       sync.Mutex
	writes   []string
	failPuts atomic.Int32 // refuse this many saves that carry events
	reads    atomic.Int32 // Events calls
	gets     atomic.Int32 // GetRun calls
	// failStage, when set, refuses the first save carrying an event of that stage.
	failStage atomic.Pointer[string]
}

// newWriteLog is a writeLog over a bbolt store in dir.
func newWriteLog(t *testing.T, dir string) *writeLog {
	t.Helper()
	bolt, err := store.Open(filepath.Join(dir, "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bolt.Close() })
	return &writeLog{Store: bolt}
}

func (w *writeLog) add(s string) {
	w.mu.Lock()
	w.writes = append(w.writes, s)
	w.mu.Unlock()
}

func (w *writeLog) PutRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	return w.put(j, evs, func() error { return w.Store.PutRun(ctx, j, evs...) })
}

// PutRunFenced is a driver's save (the fence is the store's business): logged as PutRun.
func (w *writeLog) PutRunFenced(ctx context.Context, j *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	return w.put(j, evs, func() error { return w.Store.PutRunFenced(ctx, j, epoch, evs...) })
}

func (w *writeLog) put(j *handoffv1.Job, evs []*handoffv1.JobEvent, write func() error) error {
	if len(evs) > 0 && w.failPuts.Add(-1) >= 0 {
		return errors.New("writeLog: save refused")
	}
	if st := w.failStage.Load(); st != nil && slices.ContainsFunc(evs, func(ev *handoffv1.JobEvent) bool { return ev.GetStage() == *st }) &&
		w.failStage.CompareAndSwap(st, nil) {
		return errors.New("writeLog: save refused")
	}
	var ks []string
	for _, ev := range evs {
		ks = append(ks, strings.TrimPrefix(ev.GetKind().String(), "EVENT_KIND_"))
	}
	w.add(fmt.Sprintf("PutRun(%s)[%s]", strings.TrimPrefix(j.GetState().String(), "JOB_STATE_"), strings.Join(ks, " ")))
	return write()
}

func (w *writeLog) CreateRun(ctx context.Context, j *handoffv1.Job, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, error) {
	var ks []string
	for _, ev := range evs {
		ks = append(ks, strings.TrimPrefix(ev.GetKind().String(), "EVENT_KIND_"))
	}
	w.add(fmt.Sprintf("CreateRun[%s]", strings.Join(ks, " ")))
	return w.Store.CreateRun(ctx, j, evs...)
}

func (w *writeLog) GetRun(ctx context.Context, id string) (*handoffv1.Job, error) {
	w.gets.Add(1)
	return w.Store.GetRun(ctx, id)
}

func (w *writeLog) Events(ctx context.Context, id string, after uint64) ([]*handoffv1.JobEvent, error) {
	w.reads.Add(1)
	return w.Store.Events(ctx, id, after)
}

func (w *writeLog) AppendEvent(ctx context.Context, id string, ev *handoffv1.JobEvent) (uint64, error) {
	w.add("AppendEvent(" + strings.TrimPrefix(ev.GetKind().String(), "EVENT_KIND_") + ")")
	return w.Store.AppendEvent(ctx, id, ev)
}

func (w *writeLog) Debit(ctx context.Context, id string, d store.Debit) (*handoffv1.Budget, error) {
	w.add("Debit")
	return w.Store.Debit(ctx, id, d)
}

func (w *writeLog) OpenWallet(ctx context.Context, id, job string, b *handoffv1.Budget) (*handoffv1.Budget, error) {
	w.add("OpenWallet")
	return w.Store.OpenWallet(ctx, id, job, b)
}

func (w *writeLog) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	w.add("AcquireLease")
	return w.Store.AcquireLease(ctx, name, owner, ttl)
}

// submitTicket submits job tkt_1 on the relay pipeline with budget and the sample ticket
// as its input, and returns its run id.
func submitTicket(t *testing.T, client handoffv1.CoordinatorServiceClient, in *handoffv1.Artifact, budget *handoffv1.Budget) string {
	t.Helper()
	resp, err := client.SubmitJob(context.Background(), &handoffv1.SubmitJobRequest{JobId: "tkt_1", Pipeline: "relay", Goal: "Draft a triage note",
		Budget: budget, Inputs: []*handoffv1.Artifact{in}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetJob().GetRunId()
}

// TestStepWritesOutcomeWithState: what a hop learned (the ack, the result, the verdict, the
// receipt, the end) is written with the run's new state in one PutRun; the run is created
// with its wallet and SUBMITTED event in one write; a package sent after a move without a
// verdict is written with that move, before the call, and any other package sent is
// appended on its own, overlapping the call. A spend-free stage debits nothing more, the lease is not
// renewed on every hop, and the driver starts from the run it created instead of reading it
// and opening its wallet.
func TestStepWritesOutcomeWithState(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	draft := &recorder{name: "draft"} // spends nothing
	judge := &recorder{name: "judge", spend: 50_000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}
	st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 2), Agents: []agentrunner.Agent{draft, judge}})
	ctx := context.Background()
	in := mustInput(t, st)
	wl.mu.Lock()
	wl.writes = nil
	wl.mu.Unlock()
	runID := submitTicket(t, client, in, &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	evs, err := demo.Watch(ctx, client, runID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"draft:SUBMITTED", "draft:PACKAGE_SENT", "draft:ACK:ACCEPTED", "draft:STAGE_RESULT",
		"judge:PACKAGE_SENT", "judge:ACK:ACCEPTED", "judge:STAGE_RESULT", "judge:VERDICT:PASS",
		"writeback:PACKAGE_SENT", "writeback:ACK:ACCEPTED", "writeback:RECEIPT", "writeback:COMPLETED"}; !slices.Equal(kinds(evs), want) {
		t.Fatalf("timeline\n got %v\nwant %v", kinds(evs), want)
	}
	wl.mu.Lock()
	var got []string
	for _, w := range wl.writes {
		if strings.HasPrefix(w, "PutRun") || strings.HasPrefix(w, "AppendEvent") || strings.HasPrefix(w, "CreateRun") || w == "Debit" || w == "AcquireLease" || w == "OpenWallet" {
			got = append(got, w)
		}
	}
	wl.mu.Unlock()
	want := []string{
		"CreateRun[SUBMITTED]", "AcquireLease", // the run with its wallet and first event; the driver starts from it
		// draft: spent nothing, no Debit; its move waits for the judge's package.
		"AppendEvent(PACKAGE_SENT)",
		// judge: the draft's move with the judge's package, then its spend and its outcome.
		"PutRun(RUNNING)[ACK STAGE_RESULT PACKAGE_SENT]", "Debit", "PutRun(RUNNING)[ACK STAGE_RESULT VERDICT]",
		"AppendEvent(PACKAGE_SENT)", "Debit", "PutRun(COMPLETED)[ACK RECEIPT COMPLETED]", // writeback: its hop
	}
	if !slices.Equal(got, want) {
		t.Fatalf("store writes\n got %v\nwant %v", got, want)
	}
}

// TestFailedSaveDropsItsEvents: when a hop's save fails, the events it learned are not kept
// for later: the hop is repeated from the saved run (its re-delivery answered DUPLICATE) and
// the timeline holds that repeat's outcome once, not a stale ACCEPTED from the failed one.
func TestFailedSaveDropsItsEvents(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	wl.failPuts.Store(1) // the draft's save
	draft := &recorder{name: "draft"}
	judge := &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}
	st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 2), Agents: []agentrunner.Agent{draft, judge}})
	ctx := context.Background()
	runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	evs, err := demo.Watch(ctx, client, runID, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"draft:SUBMITTED", "draft:PACKAGE_SENT", "draft:PACKAGE_SENT", "draft:ACK:DUPLICATE", "draft:STAGE_RESULT",
		"judge:PACKAGE_SENT", "judge:ACK:ACCEPTED", "judge:STAGE_RESULT", "judge:VERDICT:PASS",
		"writeback:PACKAGE_SENT", "writeback:ACK:ACCEPTED", "writeback:RECEIPT", "writeback:COMPLETED"}
	if got := kinds(evs); !slices.Equal(got, want) {
		t.Fatalf("timeline\n got %v\nwant %v", got, want)
	}
	if draft.calls() != 1 {
		t.Fatalf("draft ran %d times; want 1 (the repeat is a DUPLICATE)", draft.calls())
	}
}

// TestRepeatedStepPaysOnce: a step whose debits landed but whose save failed is repeated,
// and what it paid is not paid again, nor taken for an empty wallet: the runner's last hop
// (no HOP_CAP at the stage it paid for), the judge's last revision (no
// REVISIONS_EXHAUSTED), the writeback hop the rail debits itself (one hop, not two).
func TestRepeatedStepPaysOnce(t *testing.T) {
	for _, c := range []struct {
		name                 string
		hops, maxRevisions   uint32
		verdicts             []handoffv1.Verdict
		failStage            string
		state                handoffv1.JobState
		escalatedAt          string
		draftCalls, hopsLeft int
		revisionsLeft        uint32
	}{
		{name: "last hop", hops: 1, maxRevisions: 1, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, failStage: "draft",
			state: handoffv1.JobState_JOB_STATE_ESCALATED, escalatedAt: "judge", draftCalls: 1, hopsLeft: 0, revisionsLeft: 1},
		{name: "last revision", hops: 10, maxRevisions: 1, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}, failStage: "judge",
			state: handoffv1.JobState_JOB_STATE_COMPLETED, draftCalls: 2, hopsLeft: 5, revisionsLeft: 0},
		{name: "writeback hop", hops: 4, maxRevisions: 1, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, failStage: "writeback",
			state: handoffv1.JobState_JOB_STATE_COMPLETED, draftCalls: 1, hopsLeft: 1, revisionsLeft: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			wl := newWriteLog(t, dir)
			wl.failStage.Store(&c.failStage)
			draft := &recorder{name: "draft"}
			judge := &recorder{name: "judge", verdicts: c.verdicts}
			st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, int(c.maxRevisions)), Agents: []agentrunner.Agent{draft, judge}})
			ctx := context.Background()
			runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: c.hops})
			evs, err := demo.Watch(ctx, client, runID, nil)
			if err != nil {
				t.Fatal(err)
			}
			if wl.failStage.Load() != nil {
				t.Fatalf("no save of stage %s was refused; timeline %v", c.failStage, kinds(evs))
			}
			got, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: runID})
			if err != nil {
				t.Fatal(err)
			}
			job := got.GetJob()
			if job.GetState() != c.state || job.GetEscalation().GetStage() != c.escalatedAt {
				t.Fatalf("run %s, escalated at %q (%v); want %s at %q\ntimeline %v", job.GetState(), job.GetEscalation().GetStage(), job.GetEscalation(), c.state, c.escalatedAt, kinds(evs))
			}
			if draft.calls() != c.draftCalls {
				t.Errorf("draft ran %d times; want %d", draft.calls(), c.draftCalls)
			}
			w, err := st.Store.OpenWallet(ctx, job.GetRunId(), job.GetJobId(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if int(w.GetHopsRemaining()) != c.hopsLeft || w.GetRevisionsRemaining() != c.revisionsLeft {
				t.Errorf("wallet left %d hops, %d revisions; want %d, %d", w.GetHopsRemaining(), w.GetRevisionsRemaining(), c.hopsLeft, c.revisionsLeft)
			}
		})
	}
}

// TestWatchReadsTheStoreOnce: a watch of a run this coordinator drives gets its events from
// the coordinator's writes, not from a store read per event: the watch opened right after
// the submit starts from the events the submit kept in memory, and gets the whole timeline,
// in order, without a gap, reading the store at most once (a poll for other writers).
func TestWatchReadsTheStoreOnce(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	draft := &recorder{name: "draft", proceed: make(chan struct{})}
	judge := &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}
	st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 2), Agents: []agentrunner.Agent{draft, judge}})
	ctx := context.Background()
	runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	type result struct {
		evs []*handoffv1.JobEvent
		err error
	}
	done := make(chan result, 1)
	first := make(chan struct{})
	var once sync.Once
	go func() {
		evs, err := demo.Watch(ctx, client, runID, func(*handoffv1.JobEvent) { once.Do(func() { close(first) }) })
		done <- result{evs, err}
	}()
	// The draft holds the run until the watch has its first event.
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch never got the run's first event")
	}
	close(draft.proceed)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := []string{"draft:SUBMITTED", "draft:PACKAGE_SENT", "draft:ACK:ACCEPTED", "draft:STAGE_RESULT",
		"judge:PACKAGE_SENT", "judge:ACK:ACCEPTED", "judge:STAGE_RESULT", "judge:VERDICT:PASS",
		"writeback:PACKAGE_SENT", "writeback:ACK:ACCEPTED", "writeback:RECEIPT", "writeback:COMPLETED"}
	if got := kinds(r.evs); !slices.Equal(got, want) {
		t.Fatalf("timeline\n got %v\nwant %v", got, want)
	}
	for i, ev := range r.evs {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("event %d has seq %d; want %d", i, ev.GetSeq(), i+1)
		}
	}
	// The watch may poll once for other processes (every 500ms); the twelve events must not
	// each cost a read.
	if n := wl.reads.Load(); n > 1 {
		t.Fatalf("the watch read the store %d times; want at most 1", n)
	}
	// Nor does the run itself: only a quiet timeline (the poll) reads it, and the rail
	// drives the submitted run from memory.
	if n := wl.gets.Load(); n > 1 {
		t.Fatalf("the run was read %d times; want at most 1", n)
	}
	// Each event carries the wallet as it stood at the event (events share it with the
	// run until the next debit replaces it): from the 10 hops of the submit down to 7.
	for i, ev := range r.evs {
		h := ev.GetWallet().GetHopsRemaining()
		if i == 0 && h != 10 || i == len(r.evs)-1 && h != 7 || i > 0 && h > r.evs[i-1].GetWallet().GetHopsRemaining() {
			t.Fatalf("event %d (%s) has %d hops left in its wallet; want 10 at the submit, never rising, 7 at the end", i, ev.GetKind(), h)
		}
	}
	// The feed hands the watch the events the driver wrote, not copies: each must be
	// exactly what the store holds, nothing changed after its write.
	stored, err := wl.Store.Events(ctx, runID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(r.evs) {
		t.Fatalf("store holds %d events, the watch got %d", len(stored), len(r.evs))
	}
	for i := range stored {
		if !proto.Equal(stored[i], r.evs[i]) {
			t.Fatalf("event %d as watched\n %v\ndiffers from the store's\n %v", i, r.evs[i], stored[i])
		}
	}
}

// TestWatchSeesOtherWriters: events another process writes to the shared store (a replica
// that holds the run's lease) reach a watch here too, through its poll, in order, and the
// watch ends at the run's terminal event.
func TestWatchSeesOtherWriters(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	_, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 2),
		Agents: []agentrunner.Agent{&recorder{name: "draft"}, &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}}})
	ctx := context.Background()
	run := &handoffv1.Job{RunId: "run_elsewhere", JobId: "tkt_9", Pipeline: "relay", Stage: "draft", State: handoffv1.JobState_JOB_STATE_RUNNING}
	if _, _, err := wl.Store.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	if ok, err := wl.Store.AcquireLease(ctx, "run:"+run.GetRunId(), "other-replica", time.Minute); err != nil || !ok {
		t.Fatalf("lease for the other replica: %v, %v", ok, err)
	}
	type result struct {
		evs []*handoffv1.JobEvent
		err error
	}
	done := make(chan result, 1)
	go func() {
		evs, err := demo.Watch(ctx, client, run.GetRunId(), nil)
		done <- result{evs, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); wl.reads.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watch never read the store")
		}
	}
	if _, err := wl.Store.AppendEvent(ctx, run.GetRunId(), &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT, Stage: "draft"}); err != nil {
		t.Fatal(err)
	}
	run.State = handoffv1.JobState_JOB_STATE_COMPLETED
	if err := wl.Store.PutRun(ctx, run, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_COMPLETED, Stage: "draft"}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got, want := kinds(r.evs), []string{"draft:PACKAGE_SENT", "draft:COMPLETED"}; !slices.Equal(got, want) {
			t.Fatalf("timeline %v; want %v", got, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the watch never saw the other replica's events")
	}
}

// TestApproveRetriedPaysOnce: an approve whose save fails after the write (and its hop's
// debit) is retried by the person; the retry answers with the first write's receipt and
// does not pay the writeback hop again.
func TestApproveRetriedPaysOnce(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 0), OperatorToken: opToken,
		Agents: []agentrunner.Agent{&recorder{name: "draft"}, &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL}}}})
	ctx := context.Background()
	runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 10})
	if _, err := demo.Watch(ctx, client, runID, nil); err != nil {
		t.Fatal(err)
	}
	writeback := "writeback"
	wl.failStage.Store(&writeback)
	approve := &handoffv1.ResolveEscalationRequest{RunId: runID, Operator: "ana", Escalation: 1,
		Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{}}}
	if _, err := client.ResolveEscalation(op(), approve); status.Code(err) != codes.Unavailable {
		t.Fatalf("approve with its save refused = %v; want Unavailable", err)
	}
	again, err := client.ResolveEscalation(op(), approve)
	if err != nil {
		t.Fatal(err)
	}
	if again.GetJob().GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || again.GetReceipt() == nil {
		t.Fatalf("retried approve: %v", again)
	}
	w, err := wl.Wallet(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if w.GetHopsRemaining() != 10-3 {
		t.Fatalf("wallet has %d hops left; want 7 (draft, judge, one writeback)", w.GetHopsRemaining())
	}
}

// TestWatchersOfOneRun: several watches of one run each get the whole timeline in order as
// the driver writes it, and one that hangs up midway leaves the others their signals.
func TestWatchersOfOneRun(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	draft := &recorder{name: "draft", proceed: make(chan struct{})}
	judge := &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}
	st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 2), Agents: []agentrunner.Agent{draft, judge}})
	runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	type result struct {
		evs []*handoffv1.JobEvent
		err error
	}
	const watchers = 3
	done := make(chan result, watchers)
	// Every watch has its first event before the draft lets the run go on.
	var started sync.WaitGroup
	started.Add(watchers + 1)
	firstEvent := func() func(*handoffv1.JobEvent) {
		var once sync.Once
		return func(*handoffv1.JobEvent) { once.Do(started.Done) }
	}
	for range watchers {
		go func() {
			evs, err := demo.Watch(context.Background(), client, runID, firstEvent())
			done <- result{evs, err}
		}()
	}
	// One more watch that hangs up once it has the timeline so far.
	quitter, quit := context.WithCancel(context.Background())
	quitDone := make(chan struct{})
	go func() {
		defer close(quitDone)
		demo.Watch(quitter, client, runID, firstEvent())
	}()
	started.Wait()
	quit()
	<-quitDone
	close(draft.proceed)
	want := []string{"draft:SUBMITTED", "draft:PACKAGE_SENT", "draft:ACK:ACCEPTED", "draft:STAGE_RESULT",
		"judge:PACKAGE_SENT", "judge:ACK:ACCEPTED", "judge:STAGE_RESULT", "judge:VERDICT:PASS",
		"writeback:PACKAGE_SENT", "writeback:ACK:ACCEPTED", "writeback:RECEIPT", "writeback:COMPLETED"}
	for range watchers {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if got := kinds(r.evs); !slices.Equal(got, want) {
				t.Fatalf("a watcher's timeline\n got %v\nwant %v", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a watcher never saw the run end")
		}
	}
}

// peeker is an agent that, when called, reads its job's run and timeline from the store as
// they stand, then answers as the agent it wraps.
type peeker struct {
	agentrunner.Agent
	st   store.Store
	mu   sync.Mutex
	seen []*handoffv1.Job
	evs  [][]string
}

func (p *peeker) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	runs, _, err := p.st.ListRuns(ctx, handoffv1.JobState_JOB_STATE_RUNNING, 10, "")
	if err != nil || len(runs) != 1 {
		return nil, fmt.Errorf("peeker: %d running runs, %v; want 1", len(runs), err)
	}
	evs, err := p.st.Events(ctx, runs[0].GetRunId(), 0)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.seen, p.evs = append(p.seen, runs[0]), append(p.evs, kinds(evs))
	p.mu.Unlock()
	return p.Agent.Run(ctx, in)
}

// sawRun checks what the peeker's first call found in the store: the run at stage after
// hops, and a timeline that ends with tail.
func (p *peeker) sawRun(t *testing.T, stage string, hops uint32, tail ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		t.Fatal("the agent was not called")
	}
	if j := p.seen[0]; j.GetStage() != stage || j.GetHops() != hops {
		t.Errorf("run in the store at the call: at %s after %d hops; want at %s after %d", j.GetStage(), j.GetHops(), stage, hops)
	}
	if got := p.evs[0]; len(got) < len(tail) || !slices.Equal(got[len(got)-len(tail):], tail) {
		t.Errorf("timeline in the store at the call\n got %v\nwant it to end with %v", got, tail)
	}
}

// TestCarriedMoveSavedBeforeItsPackage: a hop without a verdict leaves its move for the
// next package, but that package's agent is called only once the store holds the move (the
// run at the new stage, the hop counted, the hop's ack and result) and the package sent,
// all in the one write before the call.
func TestCarriedMoveSavedBeforeItsPackage(t *testing.T) {
	dir := t.TempDir()
	wl := newWriteLog(t, dir)
	draft := &recorder{name: "draft"}
	judge := &peeker{Agent: &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}, st: wl.Store}
	st, client := startStack(t, stack.Config{DataDir: dir, Store: wl, Pipelines: relayPipeline(t, 10, 2), Agents: []agentrunner.Agent{draft, judge}})
	runID := submitTicket(t, client, mustInput(t, st), &handoffv1.Budget{UsdRemainingMicros: 1_000_000})
	if _, err := demo.Watch(context.Background(), client, runID, nil); err != nil {
		t.Fatal(err)
	}
	judge.sawRun(t, "judge", 1, "draft:SUBMITTED", "draft:PACKAGE_SENT", "draft:ACK:ACCEPTED", "draft:STAGE_RESULT", "judge:PACKAGE_SENT")
	if judge.Agent.(*recorder).calls() != 1 {
		t.Fatalf("judge called %d times; want 1", judge.Agent.(*recorder).calls())
	}
}
