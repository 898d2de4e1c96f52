package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// eachStore runs f on the embedded store (nil: the stack opens its own) and on the real
// Redis (storetest: fails under CI without one).
func eachStore(t *testing.T, f func(t *testing.T, s store.Store)) {
	t.Run("bbolt", func(t *testing.T) { f(t, nil) })
	t.Run("redis", func(t *testing.T) { f(t, storetest.OpenRedis(t)) })
}

// spy wraps an agent: it declares the versions a test sets (and may change) and records
// what each call was sent.
type spy struct {
	agentrunner.Agent
	accepts atomic.Pointer[[]string]
	mu      sync.Mutex
	v1      []*handoffv1.HandoffPackage
	v2      []*handoffv2.HandoffPackage // nil entries: the call was sent v1
}

func newSpy(a agentrunner.Agent, accepts ...string) *spy {
	s := &spy{Agent: a}
	s.accepts.Store(&accepts)
	return s
}

func (s *spy) Card() agentrunner.RoleCard {
	c := s.Agent.Card()
	c.Accepts = *s.accepts.Load()
	return c
}

func (s *spy) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	s.mu.Lock()
	s.v1 = append(s.v1, proto.CloneOf(in.Package))
	var v2 *handoffv2.HandoffPackage
	if in.V2 != nil {
		v2 = proto.CloneOf(in.V2)
	}
	s.v2 = append(s.v2, v2)
	s.mu.Unlock()
	return s.Agent.Run(ctx, in)
}

func (s *spy) sent() ([]*handoffv1.HandoffPackage, []*handoffv2.HandoffPackage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.v1), slices.Clone(s.v2)
}

// sentVersions are the versions of the packages the run sent, stage by stage, from its
// PACKAGE_SENT events ("" for the writeback, which is no agent).
func sentVersions(evs []*handoffv1.JobEvent) []string {
	var out []string
	for _, ev := range evs {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT {
			out = append(out, ev.GetStage()+":"+ev.GetSchema())
		}
	}
	return out
}

func startVersions(t *testing.T, s store.Store, draft, judge *spy) *env {
	t.Helper()
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.st, e.client = startStack(t, stack.Config{Store: s, Pipelines: relayPipeline(t, 12, 2), Agents: []agentrunner.Agent{draft, judge}})
	e.input = mustInput(t, e.st)
	return e
}

// The rail reads what each stage's agent declares before it sends, and sends the newest:
// draft (v1+v2) gets handoff.v2 converted from the run, with the run's deadline, and judge
// (v1) gets v1. What draft was sent is, read back as v1, exactly the package the rail built.
func TestSendsNewestDeclaredVersion(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		draft := newSpy(&recorder{name: "draft", spend: 1000}, contract.V1, contract.V2)
		judge := newSpy(&recorder{name: "judge", spend: 1000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}, contract.V1)
		e := startVersions(t, s, draft, judge)
		job, evs := e.submit(t, "relay", "tkt_v2", "", e.defaultBudget)
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("job %s: %v", job.GetState(), job.GetEscalation())
		}
		testkit.Equal(t, sentVersions(evs), []string{"draft:handoff.v2", "judge:handoff.v1", "writeback:"}, "versions sent")
		v1, v2 := draft.sent()
		if len(v2) != 1 || v2[0] == nil {
			t.Fatalf("draft was sent %v, want one v2 package", v2)
		}
		if !v2[0].GetBudget().GetDeadline().AsTime().Equal(job.GetDeadline().AsTime()) || job.GetDeadline() == nil {
			t.Errorf("v2 deadline %v, run's %v", v2[0].GetBudget().GetDeadline(), job.GetDeadline())
		}
		back, err := contract.V2ToV1(v2[0])
		if err != nil {
			t.Fatal(err)
		}
		testkit.Equal(t, back, v1[0], "the v2 package read back as v1")
		if _, jv2 := judge.sent(); len(jv2) != 1 || jv2[0] != nil {
			t.Errorf("judge was sent %v, want v1", jv2)
		}
	})
}

// A runner that drops a version it declared (downgraded in place, inside the rail's
// declaration TTL) refuses it naming it; the rail asks again and resends the hop in the
// version declared now, and the job completes: no job is lost to a stale declaration.
func TestStaleDeclarationIsResent(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		draft := newSpy(&recorder{name: "draft", spend: 1000}, contract.V1, contract.V2)
		judge := newSpy(&recorder{name: "judge", spend: 1000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}, contract.V1)
		e := startVersions(t, s, draft, judge)
		if job, _ := e.submit(t, "relay", "tkt_a", "", e.defaultBudget); job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("first job %s", job.GetState())
		}
		draft.accepts.Store(&[]string{contract.V1})
		job, evs := e.submit(t, "relay", "tkt_b", "", e.defaultBudget)
		if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
			t.Fatalf("job after the downgrade %s: %v", job.GetState(), job.GetEscalation())
		}
		for _, ev := range evs {
			if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK && ev.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
				t.Errorf("hop %d %s acked %s", ev.GetHop(), ev.GetStage(), ev.GetAck().GetStatus())
			}
		}
		if _, v2 := draft.sent(); len(v2) != 2 || v2[1] != nil {
			t.Errorf("draft after the downgrade was sent %v, want v1", v2)
		}
	})
}

// A job's deadline is set at submit: the caller's, which must be in the future, or the
// coordinator's default.
func TestSubmitDeadline(t *testing.T) {
	draft := newSpy(&recorder{name: "draft", spend: 1000}, contract.V1, contract.V2)
	judge := newSpy(&recorder{name: "judge", spend: 1000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}, contract.V1)
	e := startVersions(t, nil, draft, judge)
	req := e.request("relay", "tkt_past", "", e.defaultBudget)
	req.Deadline = timestamppb.New(time.Now().Add(-time.Minute))
	_, err := e.client.SubmitJob(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("submit with a past deadline: %v, want InvalidArgument naming deadline", err)
	}
	want := time.Now().Add(time.Hour).Truncate(time.Second)
	req = e.request("relay", "tkt_dl", "", e.defaultBudget)
	req.Deadline = timestamppb.New(want)
	resp, err := e.client.SubmitJob(context.Background(), req)
	if err != nil || !resp.GetJob().GetDeadline().AsTime().Equal(want) {
		t.Fatalf("submit with a deadline: %v, %v", resp.GetJob().GetDeadline(), err)
	}
}

// slow holds a stage until a time has passed.
type slow struct {
	agentrunner.Agent
	until time.Time
}

func (s slow) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	select {
	case <-time.After(time.Until(s.until) + 20*time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Agent.Run(ctx, in)
}

// A job's deadline is set at submit and travels on its hops (draft, on v2, is sent it); a
// stage that runs past it leaves the rail no hop to send: the run escalates DEADLINE before
// the judge, and nothing is written.
func TestDeadlineEscalates(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		dl := time.Now().Add(time.Second).Truncate(time.Millisecond)
		draft := newSpy(slow{Agent: &recorder{name: "draft", spend: 1000}, until: dl}, contract.V1, contract.V2)
		judge := newSpy(&recorder{name: "judge", spend: 1000, verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}, contract.V1)
		e := startVersions(t, s, draft, judge)
		req := e.request("relay", "tkt_late", "", e.defaultBudget)
		req.Deadline = timestamppb.New(dl)
		resp, err := e.client.SubmitJob(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := demo.Watch(context.Background(), e.client, resp.GetJob().GetRunId(), nil); err != nil {
			t.Fatal(err)
		}
		got, err := e.client.GetJob(context.Background(), &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		if err != nil {
			t.Fatal(err)
		}
		job := got.GetJob()
		if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_DEADLINE || job.GetStage() != "judge" {
			t.Fatalf("job %s at %s: %v, want ESCALATED DEADLINE before judge", job.GetState(), job.GetStage(), job.GetEscalation())
		}
		if _, v2 := draft.sent(); len(v2) != 1 || v2[0] == nil || !v2[0].GetBudget().GetDeadline().AsTime().Equal(dl) {
			t.Errorf("draft was sent %v, want v2 carrying the deadline %s", v2, dl)
		}
		if n := judge.Agent.(*recorder).calls(); n != 0 || e.writes(t) != 0 {
			t.Errorf("judge ran %d times and %d writes after the deadline", n, e.writes(t))
		}
	})
}

// describePeeker is the coordinator's runner client, reading the run from the store as it
// stands at every Describe the rail makes.
type describePeeker struct {
	handoffv1.AgentRunnerServiceClient
	st   store.Store
	mu   sync.Mutex
	seen []string // stage:hops of the running run at each Describe
}

func (d *describePeeker) Describe(ctx context.Context, in *handoffv1.DescribeRequest, opts ...grpc.CallOption) (*handoffv1.DescribeResponse, error) {
	runs, _, err := d.st.ListRuns(ctx, handoffv1.JobState_JOB_STATE_RUNNING, 10, "")
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	for _, r := range runs {
		d.seen = append(d.seen, fmt.Sprintf("%s:%d", r.GetStage(), r.GetHops()))
	}
	d.mu.Unlock()
	return d.AgentRunnerServiceClient.Describe(ctx, in, opts...)
}

// A declaration that has to be asked for again is a call that may wait on the runner: the
// draft's carried move is saved before the judge's Describe, not left behind it.
func TestCarriedMoveSavedBeforeDescribe(t *testing.T) {
	s, err := store.Open(t.TempDir() + "/describe.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	dp := &describePeeker{st: s}
	e := &env{defaultBudget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}}
	e.st, e.client = startStack(t, stack.Config{Store: s, Pipelines: relayPipeline(t, 12, 2), DescribeTTL: time.Nanosecond,
		Agents: []agentrunner.Agent{&recorder{name: "draft"}, &recorder{name: "judge", verdicts: []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}}},
		WrapRunner: func(c handoffv1.AgentRunnerServiceClient) handoffv1.AgentRunnerServiceClient {
			dp.AgentRunnerServiceClient = c
			return dp
		}})
	e.input = mustInput(t, e.st)
	if job, _ := e.submit(t, "relay", "tkt_d", "", e.defaultBudget); job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job %s: %v", job.GetState(), job.GetEscalation())
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	testkit.Equal(t, dp.seen, []string{"draft:0", "judge:1"}, "the run in the store at each Describe")
}
