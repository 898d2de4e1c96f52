package coordinator_test

// End-to-end tests of the rail: the three services on real gRPC over loopback (127.0.0.1:0)
// on one embedded store, started by internal/stack exactly as `handoff up` starts them.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/traceparent"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// relay is a small pipeline for scripted agents: draft, judge (revise draft), writeback.
const relay = `
name: relay
max_hops: %d
max_revisions: %d
escalation: {route: humans, max_grant: {hops: 8, revisions: 2, usd_micros: 1000000}}
tools:
  - {name: crm.patch, access: write, system: crm}
stages:
  - name: draft
    input: raw_ticket.v1
    output: {type: note, schema_version: note.v1}
    criteria: [drafted]
  - name: judge
    kind: judge
    revise: draft
    input: note.v1
    output: {type: verdict, schema_version: verdict.v1}
    criteria: [judged]
  - name: writeback
    kind: writeback
    input: note.v1
    writer: {system: crm, target: ledger}
    tools: [crm.patch]
    output: {type: crm_receipt, schema_version: crm_receipt.v1}
    criteria: [written]
`

// recorder is a scripted agent that records every package it is given.
type recorder struct {
	name  string
	spend int64
	// verdicts, for a judge: the verdict of each call in turn (the last one repeats).
	verdicts []handoffv1.Verdict
	// hint, for a judge, is the next hint a FAIL verdict gives.
	hint string
	// failFirst calls report STAGE_STATUS_FAILED.
	failFirst int
	// proceed, when set, holds every call until it is closed.
	proceed chan struct{}
	// same: the first same calls write the same bytes (a reviser that changes nothing);
	// every other call writes a note of its own.
	same int
	// questions, resolved and refs are the result's open_questions, resolved_questions
	// and memory_refs.
	questions, resolved, refs []string
	mu                        sync.Mutex
	got                       []*handoffv1.HandoffPackage
}

func (r *recorder) Card() agentrunner.RoleCard { return agentrunner.RoleCard{Name: r.name} }

func (r *recorder) calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func (r *recorder) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	r.mu.Lock()
	n := len(r.got)
	r.got = append(r.got, proto.Clone(in.Package).(*handoffv1.HandoffPackage))
	r.mu.Unlock()
	if r.proceed != nil {
		select {
		case <-r.proceed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res := &handoffv1.StageResult{SpentUsdMicros: r.spend, OpenQuestions: r.questions, ResolvedQuestions: r.resolved, MemoryRefs: r.refs}
	if n < r.failFirst {
		return &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_FAILED, Error: "model timed out"}, nil
	}
	if r.verdicts == nil {
		note := []byte(fmt.Sprintf("a note (call %d)", n+1))
		if n < r.same {
			note = []byte("the same note")
		}
		a, err := in.Artifacts.Put(ctx, artifact.Ref{JobID: in.Package.GetJobId(), Stage: r.name, Round: in.Round, Type: "note", SchemaVersion: "note.v1", MediaType: "text/plain"}, note)
		if err != nil {
			return nil, err
		}
		res.Artifacts = []*handoffv1.Artifact{a}
		return res, nil
	}
	v := r.verdicts[min(n, len(r.verdicts)-1)]
	res.Evaluator = &handoffv1.Evaluator{LastVerdict: v, Rounds: in.Package.GetEvaluator().GetRounds() + 1}
	if v == handoffv1.Verdict_VERDICT_FAIL {
		res.Evaluator.Failures = []*handoffv1.Failure{{Code: "citation_missing", Detail: "claim 2 cites nothing"}}
		res.NextHint = r.hint
	}
	return res, nil
}

type env struct {
	st            *stack.Stack
	client        handoffv1.CoordinatorServiceClient
	draft, judge  *recorder
	input         *handoffv1.Artifact
	defaultBudget *handoffv1.Budget
}

// testLogger keeps warnings and errors in the test log, where a failure shows them.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// startStack starts the platform from cfg on loopback: free ports, t's temp folder unless
// cfg.DataDir is set, warnings in the test log. It returns it with a coordinator client.
// anonymous is a client of st's coordinator with no identity at all, as grpcurl without
// credentials would be.
func anonymous(t *testing.T, st *stack.Stack) handoffv1.CoordinatorServiceClient {
	t.Helper()
	cc, err := st.Dial(st.CoordinatorAddr)
	if err != nil {
		t.Fatal(err)
	}
	return handoffv1.NewCoordinatorServiceClient(cc)
}

func startStack(t *testing.T, cfg stack.Config) (*stack.Stack, handoffv1.CoordinatorServiceClient) {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.CoordinatorAddr, cfg.RunnerAddr, cfg.WritebackAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	st, err := stack.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	return st, handoffv1.NewCoordinatorServiceClient(cc)
}

// relayPipeline is the relay pipeline (draft, judge, writeback) with these caps.
func relayPipeline(t *testing.T, maxHops, maxRevisions int) map[string]*pipeline.Pipeline {
	t.Helper()
	p, problems, err := pipeline.Parse("relay.yaml", []byte(fmt.Sprintf(relay, maxHops, maxRevisions)))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("relay pipeline: %v %v", err, problems)
	}
	return map[string]*pipeline.Pipeline{p.Name: p}
}

// start runs the stack with the relay pipeline and scripted agents, or with the shipped
// support pipeline and agents when verdicts is nil.
func start(t *testing.T, maxHops, maxRevisions int, verdicts []handoffv1.Verdict, tamper func(*handoffv1.HandoffPackage)) *env {
	t.Helper()
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	cfg := stack.Config{Tamper: tamper}
	if verdicts != nil {
		e.draft = &recorder{name: "draft", spend: 100_000}
		e.judge = &recorder{name: "judge", spend: 50_000, verdicts: verdicts}
		cfg.Pipelines = relayPipeline(t, maxHops, maxRevisions)
		cfg.Agents = []agentrunner.Agent{e.draft, e.judge}
	}
	e.st, e.client = startStack(t, cfg)
	e.input = mustInput(t, e.st)
	return e
}

// request is the submit e.submit sends.
func (e *env) request(pipelineName, jobID, requestID string, budget *handoffv1.Budget) *handoffv1.SubmitJobRequest {
	return &handoffv1.SubmitJobRequest{
		RequestId: requestID, JobId: jobID, Pipeline: pipelineName,
		Goal: "Draft internal triage summary; do not send to customer", Constraints: []string{"no refund promises"},
		Budget: budget, Inputs: []*handoffv1.Artifact{e.input}, MemoryRefs: []string{"customer_id:cus_9"},
	}
}

func (e *env) submit(t *testing.T, pipelineName, jobID, requestID string, budget *handoffv1.Budget) (*handoffv1.Job, []*handoffv1.JobEvent) {
	t.Helper()
	ctx := context.Background()
	resp, err := e.client.SubmitJob(ctx, e.request(pipelineName, jobID, requestID, budget))
	if err != nil {
		t.Fatalf("SubmitJob: %v", err)
	}
	evs, err := demo.Watch(ctx, e.client, resp.GetJob().GetRunId(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetJob(), evs
}

func (e *env) writes(t *testing.T) int {
	t.Helper()
	es, err := e.st.Store.LedgerEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// kinds renders the timeline compactly: "stage:KIND[:detail]".
func kinds(evs []*handoffv1.JobEvent) []string {
	var out []string
	for _, ev := range evs {
		k := strings.TrimPrefix(ev.GetKind().String(), "EVENT_KIND_")
		switch ev.GetKind() {
		case handoffv1.EventKind_EVENT_KIND_ACK:
			k += ":" + strings.TrimPrefix(ev.GetAck().GetStatus().String(), "ACK_STATUS_")
		case handoffv1.EventKind_EVENT_KIND_VERDICT:
			k += ":" + strings.TrimPrefix(ev.GetEvaluator().GetLastVerdict().String(), "VERDICT_")
		case handoffv1.EventKind_EVENT_KIND_ESCALATED:
			k += ":" + strings.TrimPrefix(ev.GetEscalation().GetCause().String(), "ESCALATION_CAUSE_")
		}
		out = append(out, ev.GetStage()+":"+k)
	}
	return out
}

func TestPassPath(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	job, evs := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("state %s, escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	want := []string{"draft:SUBMITTED", "draft:PACKAGE_SENT", "draft:ACK:ACCEPTED", "draft:STAGE_RESULT",
		"judge:PACKAGE_SENT", "judge:ACK:ACCEPTED", "judge:STAGE_RESULT", "judge:VERDICT:PASS",
		"writeback:PACKAGE_SENT", "writeback:ACK:ACCEPTED", "writeback:RECEIPT", "writeback:COMPLETED"}
	if got := kinds(evs); !slices.Equal(got, want) {
		t.Fatalf("timeline\n got %v\nwant %v", got, want)
	}
	if job.GetHops() != 3 || job.GetWallet().GetHopsRemaining() != 7 {
		t.Errorf("hops %d, left %d; want 3 made, 7 left", job.GetHops(), job.GetWallet().GetHopsRemaining())
	}
	// One wallet: both stages' spend came off the same money.
	if job.GetSpentUsdMicros() != 150_000 || job.GetWallet().GetUsdRemainingMicros() != 850_000 {
		t.Errorf("spent %d, left %d; want 150000 spent, 850000 left", job.GetSpentUsdMicros(), job.GetWallet().GetUsdRemainingMicros())
	}
	if job.GetReceipt().GetIdempotencyKey() != "tkt_1:writeback:note" || e.writes(t) != 1 {
		t.Errorf("receipt %v, writes %d; want key tkt_1:writeback:note and one write", job.GetReceipt(), e.writes(t))
	}
	// One trace from intake to receipt.
	for _, ev := range evs {
		if traceparent.TraceID(ev.GetTraceparent()) != traceparent.TraceID(job.GetTraceparent()) {
			t.Errorf("event %s on trace %q, job trace %q", ev.GetKind(), ev.GetTraceparent(), job.GetTraceparent())
		}
	}
	// The judge saw the wallet after the draft's spend, not a fresh one.
	if got := e.judge.got[0].GetBudget().GetUsdRemainingMicros(); got != 900_000 {
		t.Errorf("judge's package carried %d micro-USD, want 900000 (after the draft's spend)", got)
	}
}

func TestCritiqueLoopRevisesThenPasses(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}, nil)
	job, evs := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || job.GetRevisions() != 1 {
		t.Fatalf("state %s revisions %d; timeline %v", job.GetState(), job.GetRevisions(), kinds(evs))
	}
	if e.draft.calls() != 2 || e.judge.calls() != 2 || e.writes(t) != 1 {
		t.Fatalf("draft %d, judge %d calls, %d writes; want 2, 2, 1", e.draft.calls(), e.judge.calls(), e.writes(t))
	}
	// The revision's package carries the failures: the reviser does not start as if the
	// judge had passed.
	rev := e.draft.got[1]
	if rev.GetEvaluator().GetLastVerdict() != handoffv1.Verdict_VERDICT_FAIL || rev.GetEvaluator().GetFailures()[0].GetCode() != "citation_missing" {
		t.Fatalf("revision package evaluator = %v; want the FAIL with its failures", rev.GetEvaluator())
	}
	if rev.GetBudget().GetRevisionsRemaining() != 1 {
		t.Errorf("revision package has %d revisions left, want 1", rev.GetBudget().GetRevisionsRemaining())
	}
	// Goal and constraints are the intake's on every hop.
	for _, p := range append(e.draft.got, e.judge.got...) {
		if p.GetGoal() != e.draft.got[0].GetGoal() || !slices.Equal(p.GetConstraints(), []string{"no refund promises"}) {
			t.Errorf("package for %s changed goal/constraints: %q %v", p.GetStage(), p.GetGoal(), p.GetConstraints())
		}
	}
}

func TestRevisionsExhaustedEscalatesWithoutWriting(t *testing.T) {
	e := start(t, 20, 1, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL}, nil)
	job, evs := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REVISIONS_EXHAUSTED {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if job.GetEscalation().GetRoute() != "humans" || len(job.GetEscalation().GetReasons()) == 0 {
		t.Errorf("escalation %v: want route humans and the judge's failures as reasons", job.GetEscalation())
	}
	if e.judge.calls() != 2 || e.writes(t) != 0 {
		t.Fatalf("judge calls %d, writes %d; want 2 verdicts (one revision) and no write", e.judge.calls(), e.writes(t))
	}
}

func TestHopCapEscalates(t *testing.T) {
	// Always FAIL with plenty of revisions: only the hop cap can stop the bouncing.
	e := start(t, 5, 50, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL}, nil)
	job, evs := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_HOP_CAP {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if job.GetHops() != 5 || e.draft.calls()+e.judge.calls() != 5 || e.writes(t) != 0 {
		t.Fatalf("hops %d, agent calls %d, writes %d; want exactly 5 hops, 5 calls, no write", job.GetHops(), e.draft.calls()+e.judge.calls(), e.writes(t))
	}
}

func TestEmptyWalletEscalates(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	// The draft costs 100000; the wallet holds less, so it ends empty after the first hop.
	job, evs := e.submit(t, "relay", "tkt_1", "", &handoffv1.Budget{UsdRemainingMicros: 60_000})
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_WALLET_EMPTY {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if job.GetWallet().GetUsdRemainingMicros() != 0 || e.judge.calls() != 0 || e.writes(t) != 0 {
		t.Fatalf("wallet %d, judge calls %d, writes %d; want 0, 0, 0", job.GetWallet().GetUsdRemainingMicros(), e.judge.calls(), e.writes(t))
	}
}

func TestBadPackageRejectedWithoutAgentCall(t *testing.T) {
	// Fault injection: the package for judge loses its job_id on the way out.
	tamper := func(p *handoffv1.HandoffPackage) {
		if p.GetStage() == "judge" {
			p.JobId = ""
		}
	}
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, tamper)
	job, evs := e.submit(t, "relay", "tkt_1", "", e.defaultBudget)
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA {
		t.Fatalf("state %s escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if e.judge.calls() != 0 || e.writes(t) != 0 {
		t.Fatalf("judge called %d times, %d writes; a rejected package must cost no agent call", e.judge.calls(), e.writes(t))
	}
	var fields []string
	for _, r := range job.GetEscalation().GetReasons() {
		fields = append(fields, r.GetField())
	}
	if !slices.Contains(fields, "job_id") {
		t.Fatalf("escalation reasons name %v; want job_id", fields)
	}
}

// TestSubmitRetryReturnsSameRun: the same request under its request_id again is a retry,
// answered with the run it started; the same request_id with any other payload is refused
// with FailedPrecondition naming request_id, not answered with the old run.
func TestSubmitRetryReturnsSameRun(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	first, _ := e.submit(t, "relay", "tkt_1", "req-7", e.defaultBudget)
	resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_1", "req-7", e.defaultBudget))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetExisting() || resp.GetJob().GetRunId() != first.GetRunId() {
		t.Fatalf("retried submit = run %s existing=%v; want run %s existing", resp.GetJob().GetRunId(), resp.GetExisting(), first.GetRunId())
	}
	for name, edit := range map[string]func(r *handoffv1.SubmitJobRequest){
		"goal":        func(r *handoffv1.SubmitJobRequest) { r.Goal = "x" },
		"budget":      func(r *handoffv1.SubmitJobRequest) { r.Budget = &handoffv1.Budget{UsdRemainingMicros: 5} },
		"no inputs":   func(r *handoffv1.SubmitJobRequest) { r.Inputs = nil },
		"constraints": func(r *handoffv1.SubmitJobRequest) { r.Constraints = append(r.Constraints, "be brief") },
		"job_id":      func(r *handoffv1.SubmitJobRequest) { r.JobId = "tkt_other" },
	} {
		req := e.request("relay", "tkt_1", "req-7", e.defaultBudget)
		edit(req)
		resp, err := e.client.SubmitJob(context.Background(), req)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "request_id") || badField(err) != "request_id" {
			t.Fatalf("request_id again with another %s = %v, %v; want FailedPrecondition naming request_id", name, resp, err)
		}
	}
	if e.draft.calls() != 1 || e.writes(t) != 1 {
		t.Fatalf("draft calls %d, writes %d after a retried submit; want 1, 1", e.draft.calls(), e.writes(t))
	}
}

func TestSameJobTwiceWritesOnce(t *testing.T) {
	e := start(t, 0, 0, nil, nil) // the shipped support pipeline and agents
	first, _ := e.submit(t, "support-ticket", "tkt_1", "a", e.defaultBudget)
	second, evs := e.submit(t, "support-ticket", "tkt_1", "b", e.defaultBudget)
	if first.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || second.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("states %s, %s; want both completed", first.GetState(), second.GetState())
	}
	if first.GetRunId() == second.GetRunId() {
		t.Fatal("a new request id must start a new run")
	}
	if n := e.writes(t); n != 1 {
		t.Fatalf("%d external writes for one job submitted twice, want 1", n)
	}
	if !proto.Equal(first.GetReceipt(), second.GetReceipt()) {
		t.Fatalf("second run's receipt %v differs from the first %v", second.GetReceipt(), first.GetReceipt())
	}
	var acks []string
	for _, ev := range evs {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK {
			acks = append(acks, ev.GetStage()+":"+ev.GetAck().GetStatus().String())
		}
	}
	for _, a := range acks {
		if !strings.HasSuffix(a, "DUPLICATE") {
			t.Fatalf("second run acks %v: every hop should be DUPLICATE", acks)
		}
	}
	// Same path as the first run: the replayed judge FAIL still sends the job back once.
	if second.GetRevisions() != first.GetRevisions() || first.GetRevisions() != 1 {
		t.Fatalf("revisions %d then %d; want 1 both times", first.GetRevisions(), second.GetRevisions())
	}
}

func TestSubmitErrors(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	tests := []struct {
		name string
		req  *handoffv1.SubmitJobRequest
		code codes.Code
		want string
	}{
		{"no job id", &handoffv1.SubmitJobRequest{Pipeline: "relay", Goal: "g", Budget: e.defaultBudget}, codes.InvalidArgument, "job_id"},
		{"no budget", &handoffv1.SubmitJobRequest{JobId: "j", Pipeline: "relay", Goal: "g"}, codes.InvalidArgument, "budget"},
		{"unknown pipeline", &handoffv1.SubmitJobRequest{JobId: "j", Pipeline: "nope", Goal: "g", Budget: e.defaultBudget}, codes.NotFound, "relay"},
		{"bad traceparent", &handoffv1.SubmitJobRequest{JobId: "j", Pipeline: "relay", Goal: "g", Budget: e.defaultBudget, Trace: &handoffv1.Trace{Traceparent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}}, codes.InvalidArgument, "traceparent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.SubmitJob(context.Background(), tt.req)
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want %s mentioning %q", err, tt.code, tt.want)
			}
		})
	}
	if _, err := e.client.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: "run_missing"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetJob(missing) = %v, want NotFound", err)
	}
}

func TestContinuesCallerTrace(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, err := e.client.SubmitJob(context.Background(), &handoffv1.SubmitJobRequest{
		JobId: "tkt_9", Pipeline: "relay", Goal: "g", Budget: e.defaultBudget, Inputs: []*handoffv1.Artifact{e.input}, Trace: &handoffv1.Trace{Traceparent: tp},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := demo.Watch(ctx, e.client, resp.GetJob().GetRunId(), nil); err != nil {
		t.Fatal(err)
	}
	seen := append(e.draft.got, e.judge.got...)
	for _, p := range seen {
		if traceparent.TraceID(p.GetTrace().GetTraceparent()) != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("package for %s on trace %s; want the caller's", p.GetStage(), p.GetTrace().GetTraceparent())
		}
	}
	if len(seen) != 2 {
		t.Fatalf("%d packages seen, want 2", len(seen))
	}
}
