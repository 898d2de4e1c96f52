package coordinator_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/coordinator"
)

// The personal data of the PII tests, as typed and as any part of it would show.
const (
	piiCard    = "4111 1111 1111 1111"
	piiEmail   = "jane.doe@example.com"
	piiPhone   = "+1 415 555 0134"
	piiGoal    = "Refund the double charge on card " + piiCard + "; do not send to customer"
	piiConstr  = "reply only to " + piiEmail
	piiJudgeFn = "call the customer at " + piiPhone
)

// piiNeedles are the byte strings that must appear nowhere: each value, and the card's
// digits without their spaces (as a normaliser would store them).
var piiNeedles = []string{piiCard, "4111111111111111", piiEmail, piiPhone, "555 0134"}

// logBuffer collects every log line of every service, at every level.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// piiPipeline is the relay pipeline with the given pii policy ("" leaves the block out).
func piiPipeline(t *testing.T, policy string) map[string]*pipeline.Pipeline {
	t.Helper()
	src := fmt.Sprintf(relay, 10, 2)
	if policy != "" {
		src = strings.Replace(src, "tools:\n", "pii: {policy: "+policy+"}\ntools:\n", 1)
	}
	p, problems, err := pipeline.Parse("relay.yaml", []byte(src))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("relay pipeline: %v %v", err, problems)
	}
	if got := p.PIIPolicy(); policy != "" && got != policy {
		t.Fatalf("policy %q, want %q", got, policy)
	}
	return map[string]*pipeline.Pipeline{p.Name: p}
}

// storedBytes is everything the store holds: the bbolt file, or every value under the
// Redis store's prefix, read by type.
func storedBytes(t *testing.T, dataDir string, s store.Store, prefix string) []byte {
	t.Helper()
	if s == nil {
		b, err := os.ReadFile(filepath.Join(dataDir, "handoff.db"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rdb := storetest.RedisClient(t)
	ctx := context.Background()
	var out bytes.Buffer
	keys := storetest.RedisKeys(t, rdb, prefix)
	if len(keys) == 0 {
		t.Fatalf("no keys under %s: the scan would prove nothing", prefix)
	}
	for _, k := range keys {
		out.WriteString(k + "\n")
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var vals []string
		switch typ {
		case "string":
			v, _ := rdb.Get(ctx, k).Result()
			vals = []string{v}
		case "hash":
			m, _ := rdb.HGetAll(ctx, k).Result()
			for f, v := range m {
				vals = append(vals, f, v)
			}
		case "list":
			vals, _ = rdb.LRange(ctx, k, 0, -1).Result()
		case "set":
			vals, _ = rdb.SMembers(ctx, k).Result()
		case "zset":
			vals, _ = rdb.ZRange(ctx, k, 0, -1).Result()
		case "stream":
			xs, _ := rdb.XRange(ctx, k, "-", "+").Result()
			for _, x := range xs {
				for f, v := range x.Values {
					vals = append(vals, f, fmt.Sprint(v))
				}
			}
		default:
			t.Fatalf("key %s has type %s, which the scan cannot read", k, typ)
		}
		for _, v := range vals {
			out.WriteString(v + "\n")
		}
	}
	return out.Bytes()
}

func assertNoPII(t *testing.T, what string, b []byte) {
	t.Helper()
	for _, n := range piiNeedles {
		if bytes.Contains(b, []byte(n)) {
			t.Errorf("%s holds %q", what, n)
		}
	}
}

type piiEnv struct {
	*env
	logs    *logBuffer
	dataDir string
	store   store.Store
	prefix  string
}

func startPII(t *testing.T, s store.Store, prefix, policy string, verdicts []handoffv1.Verdict, tamper func(*handoffv1.HandoffPackage), mods ...func(*stack.Config)) *piiEnv {
	t.Helper()
	e := &piiEnv{env: &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}, logs: &logBuffer{}, dataDir: t.TempDir(), store: s, prefix: prefix}
	e.draft = &recorder{name: "draft", spend: 1000}
	e.judge = &recorder{name: "judge", spend: 1000, verdicts: verdicts, hint: piiJudgeFn}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := stack.Config{Store: s, DataDir: e.dataDir, Logger: log, Tamper: tamper,
		Pipelines: piiPipeline(t, policy), Agents: []agentrunner.Agent{e.draft, e.judge}}
	for _, m := range mods {
		m(&cfg)
	}
	e.st, e.client = startStack(t, cfg)
	e.input = mustInput(t, e.st)
	return e
}

func (e *piiEnv) piiRequest(requestID string) *handoffv1.SubmitJobRequest {
	req := e.request("relay", "tkt_1", requestID, e.defaultBudget)
	req.Goal = piiGoal
	req.Constraints = append(req.Constraints, piiConstr)
	return req
}

// run waits for the run to end and returns it with its events.
func (e *piiEnv) run(t *testing.T, runID string) (*handoffv1.Job, []*handoffv1.JobEvent) {
	t.Helper()
	ctx := context.Background()
	evs, err := demo.Watch(ctx, e.client, runID, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetJob(), evs
}

// scan checks that no log line, no stored byte and none of the run's events (as the API
// shows them) holds any of the values.
func (e *piiEnv) scan(t *testing.T, evs []*handoffv1.JobEvent) {
	t.Helper()
	e.st.Coordinator.Close() // every pending event saved
	assertNoPII(t, "the logs", []byte(e.logs.String()))
	assertNoPII(t, "the store", storedBytes(t, e.dataDir, e.store, e.prefix))
	for _, ev := range evs {
		assertNoPII(t, "event "+ev.GetKind().String(), []byte(protojson.Format(ev)))
	}
}

// piiStores runs f on the embedded store (nil: the stack opens its own) and on the real
// Redis under a prefix of its own (fails under CI without one).
func piiStores(t *testing.T, f func(t *testing.T, s store.Store, prefix string)) {
	t.Run("bbolt", func(t *testing.T) { f(t, nil, "") })
	t.Run("redis", func(t *testing.T) {
		prefix := storetest.RedisPrefix(t)
		f(t, storetest.OpenRedisPrefix(t, prefix), prefix)
	})
}

func badRequest(t *testing.T, err error) []*errdetails.BadRequest_FieldViolation {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			return br.GetFieldViolations()
		}
	}
	t.Fatalf("no BadRequest detail in %v", err)
	return nil
}

// Under the default policy (reject), a goal with a card number and a constraint with an
// e-mail address are refused at SubmitJob, InvalidArgument naming both fields, and no run
// starts; a judge's next hint with a phone number fails the stage at the runner (the run
// escalates naming next_hint, and the hint enters nothing). No value is in a log line, an
// error, an event or a stored byte, on bbolt or Redis.
func TestPIIRejected(t *testing.T) {
	piiStores(t, func(t *testing.T, s store.Store, prefix string) {
		e := startPII(t, s, prefix, "", []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}, nil)
		ctx := context.Background()
		_, err := e.client.SubmitJob(ctx, e.piiRequest("req-pii"))
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("SubmitJob = %v, want InvalidArgument", err)
		}
		var fields []string
		for _, fv := range badRequest(t, err) {
			if fv.GetReason() != "PII" {
				t.Errorf("violation %v: reason %q, want PII", fv, fv.GetReason())
			}
			fields = append(fields, fv.GetField())
		}
		testkit.Equal(t, fields, []string{"goal", "constraints[1]"}, "refused fields")
		assertNoPII(t, "the error", []byte(err.Error()))
		if e.draft.calls() != 0 {
			t.Fatalf("a refused job reached the agent %d times", e.draft.calls())
		}
		list, err := e.client.ListJobs(ctx, &handoffv1.ListJobsRequest{})
		if err != nil || len(list.GetJobs()) != 0 {
			t.Fatalf("ListJobs = %v %v, want no run", list.GetJobs(), err)
		}

		// A clean job, whose judge FAILs with a phone number in its next hint.
		resp, err := e.client.SubmitJob(ctx, e.request("relay", "tkt_1", "req-clean", e.defaultBudget))
		if err != nil {
			t.Fatal(err)
		}
		job, evs := e.run(t, resp.GetJob().GetRunId())
		esc := job.GetEscalation()
		if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED {
			t.Fatalf("state %s, escalation %v; want ESCALATED STAGE_FAILED; timeline %v", job.GetState(), esc, kinds(evs))
		}
		// The runner failed the stage before it recorded or sent the result.
		if d := esc.GetDetail(); !strings.Contains(d, "next_hint (a phone number)") {
			t.Fatalf("escalation detail %q, want it to name next_hint and the kind", d)
		}
		if e.draft.calls() != 1 {
			t.Errorf("draft called %d times, want once: the judge's hint never went back", e.draft.calls())
		}
		e.scan(t, evs)
	})
}

// Under pii.policy redact the same job runs: each value is kept in the coordinator's vault
// and its ref ("pii:<id>") stands in its place, in the run, in every package and in the
// judge's hint the draft gets back. A retried submit is the same request. The vault, and
// nothing else, holds the values.
func TestPIIRedacted(t *testing.T) {
	piiStores(t, func(t *testing.T, s store.Store, prefix string) {
		e := startPII(t, s, prefix, pipeline.PIIRedact, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}, nil)
		e.judge.hint = "cite the refund policy"
		ctx := context.Background()
		resp, err := e.client.SubmitJob(ctx, e.piiRequest("req-pii"))
		if err != nil {
			t.Fatal(err)
		}
		again, err := e.client.SubmitJob(ctx, e.piiRequest("req-pii"))
		if err != nil || !again.GetExisting() || again.GetJob().GetRunId() != resp.GetJob().GetRunId() {
			t.Fatalf("the retried submit = %v %v, want the same run", again, err)
		}
		job, evs := e.run(t, resp.GetJob().GetRunId())
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("state %s, escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
		}

		vault, err := pii.OpenVault(filepath.Join(e.dataDir, "pii-vault"))
		if err != nil {
			t.Fatal(err)
		}
		// refIn returns the one pii ref in s, checking it resolves to want.
		refIn := func(what, s, want string) {
			t.Helper()
			var refs []string
			for _, w := range strings.Fields(strings.TrimSuffix(strings.ReplaceAll(s, ";", " "), ".")) {
				if strings.HasPrefix(w, pii.RefKind+":") {
					refs = append(refs, w)
				}
			}
			if len(refs) != 1 {
				t.Fatalf("%s = %q, want one pii ref", what, s)
			}
			job, _, v, err := vault.Get(refs[0])
			if err != nil || v != want || job != "tkt_1" {
				t.Fatalf("vault.Get(%s) = %q %q %v, want %q of tkt_1", refs[0], job, v, err, want)
			}
		}
		refIn("the run's goal", job.GetGoal(), piiCard)
		refIn("the run's constraint", job.GetConstraints()[1], piiEmail)
		if len(e.draft.got) != 2 {
			t.Fatalf("draft called %d times, want 2 (once more after the FAIL)", len(e.draft.got))
		}
		for i, p := range append(e.draft.got, e.judge.got...) {
			refIn(fmt.Sprintf("package %d goal", i), p.GetGoal(), piiCard)
		}
		e.scan(t, evs)
	})
}

// A receiver fails closed on what gets past the coordinator (here injected into the package
// after the coordinator built it): the runner answers REJECTED_SCHEMA with rule pii naming
// the field, the agent is never called, and the run escalates.
func TestPIIRefusedByTheRunner(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "handoff.v1", true: "handoff.v2"}[v2], func(t *testing.T) { refusedByTheRunner(t, v2) })
	}
}

func refusedByTheRunner(t *testing.T, v2 bool) {
	// The personal data is put in on the wire, after the coordinator built and recorded its
	// package: a broken or hostile sender between the rail and the runner.
	e := startPII(t, nil, "", "", []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil, func(c *stack.Config) {
		c.WrapRunner = func(c handoffv1.AgentRunnerServiceClient) handoffv1.AgentRunnerServiceClient { return onTheWire{c} }
		if v2 {
			c.V2Agents = []string{"judge"}
		}
	})
	resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_1", "", e.defaultBudget))
	if err != nil {
		t.Fatal(err)
	}
	job, evs := e.run(t, resp.GetJob().GetRunId())
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA {
		t.Fatalf("state %s, escalation %v; timeline %v", job.GetState(), job.GetEscalation(), kinds(evs))
	}
	if e.judge.calls() != 0 {
		t.Fatalf("the judge was called %d times with personal data in its package", e.judge.calls())
	}
	var ack *handoffv1.Ack
	for _, ev := range evs {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK && ev.GetStage() == "judge" {
			ack = ev.GetAck()
		}
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || len(ack.GetReasons()) != 1 ||
		ack.GetReasons()[0].GetField() != fmt.Sprintf("open_questions[%d]", 0) || ack.GetReasons()[0].GetRule() != pii.Rule {
		t.Fatalf("judge's ack %v, want REJECTED_SCHEMA open_questions[0] pii", ack)
	}
	want := contract.V1
	if v2 {
		want = contract.V2
	}
	if got := sentVersions(evs); len(got) < 2 || got[1] != "judge:"+want {
		t.Fatalf("versions sent %v, want judge sent %q", got, want)
	}
	e.scan(t, evs)
}

// onTheWire adds an e-mail address to the judge's package (v1 or v2) in a copy of the
// request, so only the runner sees it.
type onTheWire struct {
	handoffv1.AgentRunnerServiceClient
}

func (w onTheWire) Deliver(ctx context.Context, req *handoffv1.DeliverRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[handoffv1.DeliverResponse], error) {
	req = proto.Clone(req).(*handoffv1.DeliverRequest)
	if p := req.GetPackage(); p.GetStage() == "judge" {
		p.OpenQuestions = append(p.OpenQuestions, "is "+piiEmail+" hers?")
	}
	if p := req.GetPackageV2(); p.GetStage() == "judge" {
		p.OpenQuestions = append(p.OpenQuestions, "is "+piiEmail+" hers?")
	}
	return w.AgentRunnerServiceClient.Deliver(ctx, req, opts...)
}

// leaky is a runner that does not check its agents' results (as a runner of another
// language might not): the judge's next hint it answers holds a phone number. Only the
// coordinator sees it; the runner's own record stays clean.
type leaky struct {
	handoffv1.AgentRunnerServiceClient
}

func (l leaky) Deliver(ctx context.Context, req *handoffv1.DeliverRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[handoffv1.DeliverResponse], error) {
	s, err := l.AgentRunnerServiceClient.Deliver(ctx, req, opts...)
	if err != nil || req.GetPackage().GetStage() != "judge" {
		return s, err
	}
	return leakyStream{s}, nil
}

type leakyStream struct {
	grpc.ServerStreamingClient[handoffv1.DeliverResponse]
}

func (s leakyStream) Recv() (*handoffv1.DeliverResponse, error) {
	m, err := s.ServerStreamingClient.Recv()
	if r := m.GetResult(); r != nil && r.GetEvaluator().GetLastVerdict() == handoffv1.Verdict_VERDICT_FAIL {
		r.NextHint = piiJudgeFn
	}
	return m, err
}

// The coordinator screens a stage's result too, before any of it is recorded: under reject
// the result is invalid (the run escalates naming next_hint), under redact the hint the
// draft gets back holds a ref to the vault.
func TestPIIInAStageResult(t *testing.T) {
	wrap := func(c *stack.Config) {
		c.WrapRunner = func(c handoffv1.AgentRunnerServiceClient) handoffv1.AgentRunnerServiceClient { return leaky{c} }
	}
	verdicts := []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}
	piiStores(t, func(t *testing.T, s store.Store, prefix string) {
		t.Run("reject", func(t *testing.T) {
			if s != nil {
				prefix = storetest.RedisPrefix(t)
				s = storetest.OpenRedisPrefix(t, prefix)
			}
			e := startPII(t, s, prefix, "", verdicts, nil, wrap)
			e.judge.hint = "cite the refund policy" // the leaky runner adds the phone
			resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_1", "", e.defaultBudget))
			if err != nil {
				t.Fatal(err)
			}
			job, evs := e.run(t, resp.GetJob().GetRunId())
			esc := job.GetEscalation()
			if esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED {
				t.Fatalf("state %s, escalation %v; timeline %v", job.GetState(), esc, kinds(evs))
			}
			if rs := esc.GetReasons(); len(rs) != 1 || rs[0].GetField() != "next_hint" || rs[0].GetRule() != pii.Rule {
				t.Fatalf("escalation reasons %v, want next_hint pii", rs)
			}
			if e.draft.calls() != 1 {
				t.Errorf("draft called %d times, want once", e.draft.calls())
			}
			e.scan(t, evs)
		})
		t.Run("redact", func(t *testing.T) {
			if s != nil {
				prefix = storetest.RedisPrefix(t)
				s = storetest.OpenRedisPrefix(t, prefix)
			}
			e := startPII(t, s, prefix, pipeline.PIIRedact, verdicts, nil, wrap)
			e.judge.hint = "cite the refund policy" // the leaky runner adds the phone
			resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_1", "", e.defaultBudget))
			if err != nil {
				t.Fatal(err)
			}
			job, evs := e.run(t, resp.GetJob().GetRunId())
			if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || e.draft.calls() != 2 {
				t.Fatalf("state %s after %d drafts, escalation %v; timeline %v", job.GetState(), e.draft.calls(), job.GetEscalation(), kinds(evs))
			}
			hint := e.draft.got[1].GetNextHint()
			ref, ok := strings.CutPrefix(hint, "call the customer at ")
			if !ok || !strings.HasPrefix(ref, pii.RefKind+":") {
				t.Fatalf("the hint the draft got back = %q, want the phone replaced by a ref", hint)
			}
			vault, err := pii.OpenVault(filepath.Join(e.dataDir, "pii-vault"))
			if err != nil {
				t.Fatal(err)
			}
			if _, kind, v, err := vault.Get(ref); err != nil || v != piiPhone || kind != pii.KindPhone {
				t.Fatalf("vault.Get(%s) = %q %q %v, want the phone", ref, kind, v, err)
			}
			e.scan(t, evs)
		})
	})
}

// A run whose own state holds personal data (stored before its pipeline rejected it) is
// not sent on: before the hop the coordinator escalates it REJECTED_SCHEMA naming the
// field, and no agent is called.
func TestPIIInTheRunStateIsNotSent(t *testing.T) {
	e := startPII(t, nil, "", "", []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	ctx := context.Background()
	job := &handoffv1.Job{
		RunId: "run_pii_legacy", JobId: "tkt_1", Pipeline: "relay", State: handoffv1.JobState_JOB_STATE_RUNNING,
		Goal: "refund " + piiCard, Stage: "draft", Artifacts: []*handoffv1.Artifact{e.input},
		Wallet:      &handoffv1.Budget{UsdRemainingMicros: 1_000_000, HopsRemaining: 10, RevisionsRemaining: 2, WalletId: "run_pii_legacy"},
		Traceparent: testkit.Traceparent,
	}
	if _, _, err := e.st.Store.CreateRun(ctx, job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED, Stage: "draft"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Coordinator.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	got := waitState(t, e.env, job.GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	esc := got.GetEscalation()
	if esc.GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA || len(esc.GetReasons()) != 1 ||
		esc.GetReasons()[0].GetField() != "goal" || esc.GetReasons()[0].GetRule() != pii.Rule {
		t.Fatalf("escalation %v, want REJECTED_SCHEMA goal pii", esc)
	}
	// The coordinator stopped it, not the runner: no package was sent.
	if _, evs := e.run(t, job.GetRunId()); slices.ContainsFunc(evs, func(ev *handoffv1.JobEvent) bool {
		return ev.GetKind() == handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT
	}) || e.draft.calls() != 0 {
		t.Fatalf("a package was sent (%d draft calls); timeline %v", e.draft.calls(), kinds(evs))
	}
	assertNoPII(t, "the escalation", []byte(protojson.Format(esc)))
	assertNoPII(t, "the logs", []byte(e.logs.String()))
}

// A pipeline that redacts needs somewhere to keep the values: without a vault the
// coordinator does not start.
func TestPIIRedactNeedsAVault(t *testing.T) {
	e := startPII(t, nil, "", pipeline.PIIRedact, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	rc, err := e.st.DialAs(e.st.RunnerAddr, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	val, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	_, err = coordinator.New(coordinator.Options{
		Store: e.st.Store, Pipelines: piiPipeline(t, pipeline.PIIRedact), Validator: val,
		Runner: handoffv1.NewAgentRunnerServiceClient(rc), Writeback: handoffv1.NewWritebackServiceClient(rc),
	})
	if err == nil || !strings.Contains(err.Error(), "pii.policy redact but no vault") {
		t.Fatalf("New without a vault = %v, want the refusal", err)
	}
}

// An operator's comment becomes the run's next hint and its stored resolution, so it is
// screened as a job's own text: under reject a comment or a fail reason holding personal
// data is InvalidArgument naming it (and the run stays escalated); under redact the hint the
// draft gets back holds the ref.
func TestPIIInAnOperatorsWords(t *testing.T) {
	verdicts := []handoffv1.Verdict{handoffv1.Verdict_VERDICT_FAIL, handoffv1.Verdict_VERDICT_PASS}
	escalated := func(t *testing.T, e *piiEnv) *handoffv1.Job {
		t.Helper()
		resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_1", "", e.defaultBudget))
		if err != nil {
			t.Fatal(err)
		}
		// The judge's FAIL hint holds a phone number: the runner fails the stage, and the
		// run escalates.
		return waitState(t, e.env, resp.GetJob().GetRunId(), handoffv1.JobState_JOB_STATE_ESCALATED)
	}
	back := func(job *handoffv1.Job, comment string) *handoffv1.ResolveEscalationRequest {
		return &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1, Comment: comment,
			Action: &handoffv1.ResolveEscalationRequest_ReturnToStage{ReturnToStage: &handoffv1.ReturnToStageAction{Stage: "draft"}}}
	}
	t.Run("reject", func(t *testing.T) {
		e := startPII(t, nil, "", "", verdicts, nil)
		job := escalated(t, e)
		fail := &handoffv1.ResolveEscalationRequest{RunId: job.GetRunId(), Operator: "ana", Escalation: 1,
			Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "customer " + piiEmail + " asked to stop"}}}
		for _, c := range []struct {
			req   *handoffv1.ResolveEscalationRequest
			field string
		}{{back(job, "refund to "+piiCard), "comment"}, {fail, "fail.reason"}} {
			_, err := e.client.ResolveEscalation(op(), c.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("ResolveEscalation = %v, want InvalidArgument", err)
			}
			if fvs := badRequest(t, err); len(fvs) != 1 || fvs[0].GetField() != c.field || fvs[0].GetReason() != "PII" {
				t.Fatalf("violations %v, want %s PII", fvs, c.field)
			}
			assertNoPII(t, "the error", []byte(err.Error()))
		}
		got, err := e.client.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: job.GetRunId()})
		if err != nil || got.GetJob().GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || got.GetJob().GetResolution() != nil {
			t.Fatalf("after the refusals: %v %v, want the run still escalated, unresolved", got.GetJob(), err)
		}
		_, evs := e.run(t, job.GetRunId())
		e.scan(t, evs)
	})
	t.Run("redact", func(t *testing.T) {
		e := startPII(t, nil, "", pipeline.PIIRedact, verdicts, nil)
		job := escalated(t, e)
		if _, err := e.client.ResolveEscalation(op(), back(job, "refund to "+piiCard)); err != nil {
			t.Fatal(err)
		}
		done := waitState(t, e.env, job.GetRunId(), handoffv1.JobState_JOB_STATE_COMPLETED)
		if e.draft.calls() != 2 {
			t.Fatalf("draft called %d times, want 2", e.draft.calls())
		}
		hint := e.draft.got[1].GetNextHint()
		ref, ok := strings.CutPrefix(hint, "operator: refund to ")
		if !ok || !strings.HasPrefix(ref, pii.RefKind+":") {
			t.Fatalf("the draft's hint = %q, want the card replaced by a ref", hint)
		}
		vault, err := pii.OpenVault(filepath.Join(e.dataDir, "pii-vault"))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, v, err := vault.Get(ref); err != nil || v != piiCard {
			t.Fatalf("vault.Get(%s) = %q %v, want the card", ref, v, err)
		}
		if c := done.GetResolution().GetComment(); strings.Contains(c, "4111") {
			t.Fatalf("the stored resolution's comment %q holds the card", c)
		}
		_, evs := e.run(t, job.GetRunId())
		e.scan(t, evs)
	})
}

// refuser is a draft agent whose error quotes what it read, as a model's refusal may.
type refuser struct{}

func (refuser) Card() agentrunner.RoleCard { return agentrunner.RoleCard{Name: "draft"} }

func (refuser) Run(context.Context, agentrunner.Input) (*handoffv1.StageResult, error) {
	return nil, fmt.Errorf("model refused: I will not write to %s about card %s", piiEmail, piiCard)
}

// An agent's error is kept (the failed result, the escalation, the runner's log line) with
// its personal data masked.
func TestPIIInAnAgentsError(t *testing.T) {
	e := startPII(t, nil, "", "", []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil, func(c *stack.Config) { c.Agents[0] = refuser{} })
	resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_1", "", e.defaultBudget))
	if err != nil {
		t.Fatal(err)
	}
	job, evs := e.run(t, resp.GetJob().GetRunId())
	d := job.GetEscalation().GetDetail()
	if job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_STAGE_FAILED ||
		!strings.Contains(d, "I will not write to [email] about card [card]") {
		t.Fatalf("escalation %v, want STAGE_FAILED with the error masked", job.GetEscalation())
	}
	if !strings.Contains(e.logs.String(), "[email]") {
		t.Fatal("the runner did not log the (masked) failure")
	}
	e.scan(t, evs)
}
