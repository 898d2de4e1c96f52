package agentrunner_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

const traceparent = testkit.Traceparent

// fake is a counting agent whose behaviour a test sets.
type fake struct {
	card  agentrunner.RoleCard
	calls atomic.Int32
	run   func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error)
}

func (f *fake) Card() agentrunner.RoleCard { return f.card }

func (f *fake) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	f.calls.Add(1)
	if f.run != nil {
		return f.run(ctx, in)
	}
	return writeOne(ctx, in)
}

// writeOne stores a small artifact and returns it, with a spend.
func writeOne(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	a, err := in.Artifacts.Put(ctx, artifact.Ref{
		JobID: in.Package.GetJobId(), Stage: in.Package.GetStage(), Round: in.Round,
		Type: "note", SchemaVersion: "note.v1", MediaType: "text/plain",
	}, []byte("hello from "+in.Package.GetStage()))
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{Artifacts: []*handoffv1.Artifact{a}, SpentUsdMicros: 1200, NextHint: "next"}, nil
}

type env struct {
	client handoffv1.AgentRunnerServiceClient
	conn   *grpc.ClientConn
	dbPath string
	st     *store.Bolt
	arts   *artifact.Files
	stop   func()
}

func start(t *testing.T, opts agentrunner.Options, dbPath string) *env {
	t.Helper()
	if dbPath == "" {
		dbPath = filepath.Join(t.TempDir(), "agentrunner.db")
	}
	st, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	arts := opts.Artifacts
	if arts == nil {
		f, err := artifact.NewFiles(filepath.Join(filepath.Dir(dbPath), "artifacts"))
		if err != nil {
			t.Fatal(err)
		}
		arts = f
	}
	if opts.Store == nil {
		opts.Store = st
	}
	opts.Artifacts = arts
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv, err := agentrunner.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// The real chain (the runner's interceptors in internal/server's), as the binary serves it.
	gs := assemble(t, srv, opts.Logger)
	conn := testkit.Serve(t, gs)
	var once sync.Once
	e := &env{client: handoffv1.NewAgentRunnerServiceClient(conn), conn: conn, dbPath: dbPath, st: st, stop: func() {
		once.Do(func() {
			conn.Close()
			gs.Stop()
			st.Close()
		})
	}}
	if f, ok := arts.(*artifact.Files); ok {
		e.arts = f
	}
	t.Cleanup(e.stop)
	return e
}

// assemble is srv's server as the binary assembles it, without the identity check.
func assemble(t testing.TB, srv *agentrunner.Server, log *slog.Logger) *server.Server {
	t.Helper()
	gs, err := server.New(srv.Service(), server.WithoutIdentity(), server.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

// pkg is a valid package of job-1 for stage.
func pkg(stage string) *handoffv1.HandoffPackage {
	return testkit.Package(testkit.AtStage(stage), testkit.WithBudget(&handoffv1.Budget{UsdRemainingMicros: 50000, RevisionsRemaining: 2, HopsRemaining: 8}),
		func(p *handoffv1.HandoffPackage) {
			p.Goal = "Triage ticket T-1042"
			p.Constraints = []string{"no refund promises"}
		})
}

// deliver runs Deliver to the end and returns every message and the final error (nil at EOF).
func deliver(t *testing.T, c handoffv1.AgentRunnerServiceClient, req *handoffv1.DeliverRequest) ([]*handoffv1.DeliverResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Deliver(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []*handoffv1.DeliverResponse
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

func reasonFields(a *handoffv1.Ack) (fields, rules []string) {
	for _, r := range a.GetReasons() {
		fields = append(fields, r.GetField())
		rules = append(rules, r.GetRule())
	}
	return
}

func TestGatesReject(t *testing.T) {
	draft := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	retrieve := &fake{card: agentrunner.RoleCard{Name: "retrieve", Tools: []string{"kb.search"}}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{draft, retrieve}}, "")

	type tc struct {
		name   string
		req    *handoffv1.DeliverRequest
		status handoffv1.AckStatus
		fields []string
		rule   string
		msg    string
	}
	mod := func(stage string, f func(p *handoffv1.HandoffPackage)) *handoffv1.HandoffPackage {
		p := pkg(stage)
		f(p)
		return p
	}
	cases := []tc{
		{"missing job_id", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.JobId = "" })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"job_id"}, "required", ""},
		{"missing budget and goal", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.Budget = nil; p.Goal = "" })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"goal", "budget"}, "required", ""},
		{"unknown version", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.Schema = "handoff.v9" })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"schema"}, "version.accepted", ""},
		{"bad traceparent", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.Trace.Traceparent = "nope" })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"trace.traceparent"}, "string.pattern", ""},
		{"schema before role", &handoffv1.DeliverRequest{Package: mod("nosuch", func(p *handoffv1.HandoffPackage) { p.Goal = "" })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, []string{"goal"}, "required", ""},
		{"unknown stage", &handoffv1.DeliverRequest{Package: pkg("writeback")},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, []string{"stage"}, "role.agent", "writeback"},
		{"unknown agent", &handoffv1.DeliverRequest{Package: pkg("draft"), Agent: "drafter"},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, []string{"agent"}, "role.agent", "drafter"},
		{"missing tool", &handoffv1.DeliverRequest{Package: pkg("retrieve"), RequiredTools: []string{"kb.search", "crm.patch", "email.send"}},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, []string{"required_tools[1]", "required_tools[2]"}, "role.tools", "crm.patch"},
		{"tool on a tool-less agent", &handoffv1.DeliverRequest{Package: pkg("draft"), RequiredTools: []string{"kb.search"}},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, []string{"required_tools[0]"}, "role.tools", "kb.search"},
		{"role before budget", &handoffv1.DeliverRequest{Package: mod("nosuch", func(p *handoffv1.HandoffPackage) { p.Budget.UsdRemainingMicros = 0 })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, []string{"stage"}, "role.agent", ""},
		{"empty money", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.Budget.UsdRemainingMicros = 0 })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, []string{"budget.usd_remaining_micros"}, "budget.empty", ""},
		{"empty hops", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.Budget.HopsRemaining = 0 })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, []string{"budget.hops_remaining"}, "budget.empty", ""},
		{"empty wallet", &handoffv1.DeliverRequest{Package: mod("draft", func(p *handoffv1.HandoffPackage) { p.Budget = &handoffv1.Budget{} })},
			handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, []string{"budget.usd_remaining_micros", "budget.hops_remaining"}, "budget.empty", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msgs, err := deliver(t, e.client, c.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != 1 || msgs[0].GetAck() == nil {
				t.Fatalf("want exactly one Ack, got %v", msgs)
			}
			ack := msgs[0].GetAck()
			if ack.Status != c.status {
				t.Fatalf("status %v, want %v (reasons %v)", ack.Status, c.status, ack.Reasons)
			}
			fields, rules := reasonFields(ack)
			for _, f := range c.fields {
				found := false
				for i := range fields {
					if fields[i] == f && rules[i] == c.rule {
						found = true
					}
				}
				if !found {
					t.Errorf("no reason (%s, %s) in %v", f, c.rule, ack.Reasons)
				}
			}
			if c.rule != "required" && len(fields) != len(c.fields) {
				t.Errorf("reasons %v, want fields %v", ack.Reasons, c.fields)
			}
			if c.msg != "" && !strings.Contains(ack.Reasons[0].Message, c.msg) {
				t.Errorf("reason message %q does not name %q", ack.Reasons[0].Message, c.msg)
			}
			if c.req.Package.JobId != "" && ack.JobId != c.req.Package.JobId {
				t.Errorf("ack job_id %q", ack.JobId)
			}
			// Check gives the same Ack and does no work.
			cr, err := e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: c.req.Package, Agent: c.req.Agent, RequiredTools: c.req.RequiredTools})
			if err != nil {
				t.Fatal(err)
			}
			testkit.Equal(t, cr.Ack, ack, "Check's ack against Deliver's")
		})
	}
	if n := draft.calls.Load() + retrieve.calls.Load(); n != 0 {
		t.Fatalf("rejected packages cost %d agent calls, want 0", n)
	}
}

func TestBadRequest(t *testing.T) {
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{&fake{card: agentrunner.RoleCard{Name: "draft"}}}}, "")
	tooMany := make([]string, 65)
	for i := range tooMany {
		tooMany[i] = "t" + strconv.Itoa(i)
	}
	for name, req := range map[string]*handoffv1.DeliverRequest{
		"bad agent":      {Package: pkg("draft"), Agent: "Not A Name"},
		"long agent":     {Package: pkg("draft"), Agent: strings.Repeat("a", 65)},
		"long tool":      {Package: pkg("draft"), RequiredTools: []string{strings.Repeat("x", 129)}},
		"too many tools": {Package: pkg("draft"), RequiredTools: tooMany},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := deliver(t, e.client, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("Deliver: %v, want InvalidArgument", err)
			}
			_, err = e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: req.Package, Agent: req.Agent, RequiredTools: req.RequiredTools})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("Check: %v, want InvalidArgument", err)
			}
		})
	}
	// No package at all: the schema gate answers it with a REJECTED_SCHEMA Ack for the package
	// as a whole (validate.PackageAckRejecter). Before the interceptor chain this was
	// InvalidArgument.
	t.Run("nil package", func(t *testing.T) {
		msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("Deliver: %v %v", msgs, err)
		}
		ack := msgs[0].GetAck()
		if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || len(ack.Reasons) != 1 ||
			ack.Reasons[0].Field != "" || ack.Reasons[0].Rule != "required" {
			t.Fatalf("Deliver ack %v", ack)
		}
		cr, err := e.client.Check(context.Background(), &handoffv1.CheckRequest{})
		if err != nil || !proto.Equal(cr.GetAck(), ack) {
			t.Fatalf("Check: %v %v, want %v", cr, err, ack)
		}
	})
}

func TestAcceptedThenDuplicate(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "retrieve", Tools: []string{"kb.search"}}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	req := &handoffv1.DeliverRequest{Package: pkg("retrieve"), RequiredTools: []string{"kb.search"}}

	cr, err := e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: req.Package, RequiredTools: req.RequiredTools})
	if err != nil || cr.Ack.Status != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("Check before: %v %v", cr, err)
	}
	if ag.calls.Load() != 0 {
		t.Fatal("Check ran the agent")
	}

	msgs, err := deliver(t, e.client, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 {
		t.Fatalf("want Ack + StageResult, got %v", msgs)
	}
	ack, res := msgs[0].GetAck(), msgs[1].GetResult()
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || ack.JobId != "job-1" || ack.Stage != "retrieve" || ack.Traceparent != traceparent || ack.Schema != "handoff.v1" {
		t.Fatalf("first message %v", msgs[0])
	}
	if res == nil || res.Status != handoffv1.StageStatus_STAGE_STATUS_COMPLETED || res.JobId != "job-1" || res.Stage != "retrieve" ||
		res.Traceparent != traceparent || len(res.Artifacts) != 1 || res.SpentUsdMicros != 1200 || res.NextHint != "next" {
		t.Fatalf("result %v", msgs[1])
	}

	// Re-delivery: DUPLICATE with the prior artifacts, no second run, stream ends.
	msgs, err = deliver(t, e.client, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		t.Fatalf("re-delivery: %v", msgs)
	}
	prior := msgs[0].GetAck().GetPrior()
	if len(prior.GetArtifacts()) != 1 || !proto.Equal(prior.Artifacts[0], res.Artifacts[0]) || prior.GetNextHint() != "next" || prior.GetCompletedAt() == nil {
		t.Fatalf("prior %v, want artifacts %v", prior, res.Artifacts)
	}
	if n := ag.calls.Load(); n != 1 {
		t.Fatalf("agent calls %d, want 1", n)
	}
	// A re-delivery with a different attempt-ish detail (hint, spend) is still the same key.
	p2 := proto.Clone(req.Package).(*handoffv1.HandoffPackage)
	p2.NextHint = "retry 2"
	p2.Budget.UsdRemainingMicros = 40000
	if msgs, _ := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p2}); msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		t.Fatalf("re-delivery with a new hint: %v", msgs)
	}
	cr, err = e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: req.Package})
	if err != nil || cr.Ack.Status != handoffv1.AckStatus_ACK_STATUS_DUPLICATE || len(cr.Ack.Prior.GetArtifacts()) != 1 {
		t.Fatalf("Check after: %v %v", cr, err)
	}

	// A revision after a judge verdict (one more round) is a new key and runs.
	p3 := proto.Clone(req.Package).(*handoffv1.HandoffPackage)
	p3.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1, Failures: []*handoffv1.Failure{{Code: "citation_missing"}}}
	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p3})
	if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("revision: %v %v", msgs, err)
	}
	if msgs[1].GetResult().Artifacts[0].Uri == res.Artifacts[0].Uri {
		t.Error("revision overwrote the round-0 artifact")
	}
	if n := ag.calls.Load(); n != 2 {
		t.Fatalf("agent calls %d, want 2", n)
	}

	// The completion survives a restart of the runner and its store.
	e.stop()
	e2 := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, e.dbPath)
	msgs, err = deliver(t, e2.client, req)
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		t.Fatalf("after restart: %v %v", msgs, err)
	}
	if n := ag.calls.Load(); n != 2 {
		t.Fatalf("agent calls %d after restart, want 2", n)
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	release := make(chan struct{})
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		<-release
		return writeOne(ctx, in)
	}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	req := &handoffv1.DeliverRequest{Package: pkg("draft")}

	const n = 12
	type out struct {
		msgs []*handoffv1.DeliverResponse
		err  error
	}
	results := make(chan out, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := deliver(t, e.client, req)
			results <- out{m, err}
		}()
	}
	// Wait until the one winner is running, then let the losers see the pending claim.
	testkit.Eventually(t, 5*time.Second, "the winner's agent to run", func() bool { return ag.calls.Load() > 0 })
	// Check sees the stage in flight.
	if _, err := e.client.Check(context.Background(), &handoffv1.CheckRequest{Package: req.Package}); status.Code(err) != codes.Aborted {
		t.Errorf("Check while in flight: %v, want Aborted", err)
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	close(results)

	var completed, aborted, dup int
	for r := range results {
		switch {
		case r.err != nil:
			if status.Code(r.err) != codes.Aborted || !strings.Contains(status.Convert(r.err).Message(), "in flight") {
				t.Errorf("unexpected error %v", r.err)
			}
			if len(r.msgs) != 0 {
				t.Errorf("an in-flight answer sent messages %v", r.msgs)
			}
			aborted++
		case len(r.msgs) == 2 && r.msgs[1].GetResult().GetStatus() == handoffv1.StageStatus_STAGE_STATUS_COMPLETED:
			completed++
		case len(r.msgs) == 1 && r.msgs[0].GetAck().GetStatus() == handoffv1.AckStatus_ACK_STATUS_DUPLICATE:
			dup++
		default:
			t.Errorf("unexpected answer %v", r.msgs)
		}
	}
	if calls := ag.calls.Load(); calls != 1 || completed != 1 {
		t.Fatalf("agent calls %d, completed %d (aborted %d, duplicate %d): want exactly one run", calls, completed, aborted, dup)
	}
	t.Logf("completed %d, aborted (in flight) %d, duplicate %d", completed, aborted, dup)
}

func TestFailureReleasesClaim(t *testing.T) {
	var mode atomic.Value
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		switch mode.Load().(string) {
		case "error":
			return nil, errors.New("model endpoint returned 503")
		case "panic":
			panic("nil map")
		case "hang":
			<-ctx.Done()
			return nil, ctx.Err()
		case "ignore-ctx":
			time.Sleep(400 * time.Millisecond)
			return writeOne(context.Background(), in)
		case "wrong-job":
			return &handoffv1.StageResult{JobId: "job-2"}, nil
		case "invalid":
			return &handoffv1.StageResult{SpentUsdMicros: -5}, nil
		case "nil":
			return nil, nil
		case "self-failed":
			return &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_FAILED, Error: "gave up"}, nil
		}
		return writeOne(ctx, in)
	}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}, StageTimeout: 150 * time.Millisecond}, "")

	for i, c := range []struct{ mode, want string }{
		{"error", "503"},
		{"panic", "panicked"},
		{"hang", "timeout"},
		{"ignore-ctx", "timeout"},
		{"wrong-job", "job-2"},
		{"invalid", "spent_usd_micros"},
		{"nil", "no result"},
		{"self-failed", "gave up"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			p := pkg("draft")
			p.JobId = "job-f" + string(rune('a'+i))
			req := &handoffv1.DeliverRequest{Package: p}
			mode.Store(c.mode)
			before := ag.calls.Load()
			msgs, err := deliver(t, e.client, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != 2 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
				t.Fatalf("messages %v", msgs)
			}
			res := msgs[1].GetResult()
			if res.Status != handoffv1.StageStatus_STAGE_STATUS_FAILED || !strings.Contains(res.Error, c.want) || res.JobId != p.JobId || res.Traceparent != traceparent {
				t.Fatalf("result %v, want FAILED mentioning %q", res, c.want)
			}
			// The claim was released: a retry runs the stage again and completes.
			mode.Store("ok")
			msgs, err = deliver(t, e.client, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != 2 || msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
				t.Fatalf("retry: %v", msgs)
			}
			if n := ag.calls.Load() - before; n != 2 {
				t.Fatalf("agent calls %d, want 2", n)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	arts, _ := artifact.NewFiles(t.TempDir())
	for name, o := range map[string]agentrunner.Options{
		"no store":     {Artifacts: arts},
		"no artifacts": {Store: st},
		"dup agent":    {Store: st, Artifacts: arts, Agents: []agentrunner.Agent{agentrunner.NewNoop("a"), agentrunner.NewNoop("a")}},
		"bad name":     {Store: st, Artifacts: arts, Agents: []agentrunner.Agent{agentrunner.NewNoop("Draft")}},
		"nil agent":    {Store: st, Artifacts: arts, Agents: []agentrunner.Agent{nil}},
	} {
		if _, err := agentrunner.New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	for _, c := range []struct {
		round, returns uint32
		want           string
	}{{2, 0, "stage:job-1:draft:2"}, {0, 1, "stage:job-1:draft:0:o1"}, {2, 3, "stage:job-1:draft:2:o3"}} {
		if got := agentrunner.CompletionKey("job-1", "draft", c.round, c.returns); got != c.want {
			t.Errorf("CompletionKey(round %d, returns %d) = %q, want %q", c.round, c.returns, got, c.want)
		}
	}
}

func TestHealthAndNoop(t *testing.T) {
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{&agentrunner.Noop{Role: agentrunner.RoleCard{Name: "bench"}, WriteArtifact: true}}}, "")
	hr, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "handoff.v1.AgentRunnerService"})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v %v", hr, err)
	}
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: pkg("bench")})
	if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetSpentUsdMicros() != 0 || len(msgs[1].GetResult().GetArtifacts()) != 1 {
		t.Fatalf("noop: %v %v", msgs, err)
	}
}

// The support pipeline over gRPC: intake -> retrieve -> draft -> judge FAIL -> draft -> judge
// PASS, with the package built from the previous results as the rail would.
func TestSupportPipelineOverGRPC(t *testing.T) {
	e := start(t, agentrunner.Options{Agents: support.Agents()}, "")
	v, _ := contract.NewValidator()
	in, err := e.arts.Put(context.Background(), artifact.Ref{JobID: "job-1", Stage: "input", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
	if err != nil {
		t.Fatal(err)
	}
	p := pkg("intake")
	p.Constraints = []string{"no refund promises", "do not send to customer"}
	p.Artifacts = []*handoffv1.Artifact{in}
	p.Budget.UsdRemainingMicros = 30000

	tools := map[string][]string{"intake": {"tickets.get"}, "retrieve": {"kb.search"}}
	var verdicts []handoffv1.Verdict
	for _, stage := range []string{"intake", "retrieve", "draft", "judge", "draft", "judge"} {
		p.Stage = stage
		if r := v.CheckV1(p); r != nil {
			t.Fatalf("%s: package invalid: %v", stage, r)
		}
		msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p, RequiredTools: tools[stage]})
		if err != nil {
			t.Fatalf("%s: %v", stage, err)
		}
		if len(msgs) != 2 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
			t.Fatalf("%s: %v", stage, msgs)
		}
		res := msgs[1].GetResult()
		if res.Status != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
			t.Fatalf("%s: %v", stage, res)
		}
		p.Artifacts = append(p.Artifacts, res.Artifacts...)
		p.OpenQuestions = append(p.OpenQuestions, res.OpenQuestions...)
		p.ToolsTried = append(p.ToolsTried, res.ToolsTried...)
		p.Budget.UsdRemainingMicros -= res.SpentUsdMicros
		p.Budget.HopsRemaining--
		p.NextHint = res.NextHint
		if res.Evaluator != nil {
			p.Evaluator = res.Evaluator
			verdicts = append(verdicts, res.Evaluator.LastVerdict)
			if res.Evaluator.LastVerdict == handoffv1.Verdict_VERDICT_FAIL && res.Evaluator.Failures[0].Code != "citation_missing" {
				t.Fatalf("first verdict failures %v", res.Evaluator.Failures)
			}
		}
	}
	if len(verdicts) != 2 || verdicts[0] != handoffv1.Verdict_VERDICT_FAIL || verdicts[1] != handoffv1.Verdict_VERDICT_PASS {
		t.Fatalf("verdicts %v, want FAIL then PASS", verdicts)
	}
	if p.Evaluator.Rounds != 2 || p.Budget.UsdRemainingMicros != 30000-(1500+2500+2*4000+2*3000) {
		t.Fatalf("evaluator %v, wallet %d", p.Evaluator, p.Budget.UsdRemainingMicros)
	}
	// The judge's second verdict is recorded: re-delivering it replays PASS.
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: func() *handoffv1.HandoffPackage {
		q := proto.Clone(p).(*handoffv1.HandoffPackage)
		q.Stage = "judge"
		q.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_FAIL, Rounds: 1, Failures: []*handoffv1.Failure{{Code: "citation_missing"}}}
		return q
	}()})
	if err != nil || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE ||
		msgs[0].GetAck().GetPrior().GetEvaluator().GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS {
		t.Fatalf("replayed judge: %v %v", msgs, err)
	}
}

// A claim left by a runner that died mid-stage blocks re-deliveries until its claim TTL
// lapses, then the stage runs; a completion record expires after ResultTTL.
func TestClaimAndResultTTL(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}, StageTimeout: 100 * time.Millisecond,
		ResultTTL: 400 * time.Millisecond}, "")
	p := pkg("draft")
	key := agentrunner.CompletionKey(p.JobId, p.Stage, 0, 0)
	if st, _, _, err := e.st.Claim(context.Background(), key, 300*time.Millisecond); err != nil || st != store.Claimed {
		t.Fatalf("claim: %v %v", st, err)
	}
	if _, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p}); status.Code(err) != codes.Aborted {
		t.Fatalf("while the dead runner's claim lives: %v, want Aborted", err)
	}
	time.Sleep(350 * time.Millisecond)
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("after the claim expired: %v %v", msgs, err)
	}
	if msgs, _ := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p}); msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
		t.Fatalf("within ResultTTL: %v", msgs)
	}
	time.Sleep(450 * time.Millisecond)
	if msgs, _ := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p}); msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("after ResultTTL: %v", msgs)
	}
	if n := ag.calls.Load(); n != 2 {
		t.Fatalf("agent calls %d, want 2", n)
	}
}

// A failed run still reports what it spent (agentrunner.RunError).
func TestFailedRunKeepsSpend(t *testing.T) {
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		return nil, &agentrunner.RunError{Err: errors.New("model answered garbage"), SpentUsdMicros: 777,
			ToolsTried: []*handoffv1.ToolAttempt{{Name: "llm.chat", Ok: false, ErrorCode: "bad_output"}, {Name: "bad name!"}}}
	}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{ag}}, "")
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: pkg("draft")})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("%v %v", msgs, err)
	}
	res := msgs[1].GetResult()
	if res.Status != handoffv1.StageStatus_STAGE_STATUS_FAILED || res.SpentUsdMicros != 777 || len(res.ToolsTried) != 1 || !strings.Contains(res.Error, "garbage") {
		t.Fatalf("result %v", res)
	}
}

// BenchmarkDeliverNoop measures one hop through the runner (the rpc chain with the runner's
// interceptors: schema, role, claim, budget; Noop agent, completion record, Ack +
// StageResult) over bufconn with the bbolt store.
func BenchmarkDeliverNoop(b *testing.B) {
	dir := b.TempDir()
	st, err := store.Open(filepath.Join(dir, "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	arts, _ := artifact.NewFiles(filepath.Join(dir, "artifacts"))
	srv, err := agentrunner.New(agentrunner.Options{Store: st, Artifacts: arts, Agents: []agentrunner.Agent{agentrunner.NewNoop("bench")},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	c := handoffv1.NewAgentRunnerServiceClient(testkit.Serve(b, assemble(b, srv, slog.New(slog.DiscardHandler))))
	p := pkg("bench")
	for i := 0; b.Loop(); i++ {
		p.JobId = "bench-" + strconv.Itoa(i)
		s, err := c.Deliver(context.Background(), &handoffv1.DeliverRequest{Package: p})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			_, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != 2 {
			b.Fatalf("%d messages", n)
		}
	}
}

// countingStore records which store calls the runner makes.
type countingStore struct {
	agentrunner.Store
	mu    sync.Mutex
	calls []string
}

func (c *countingStore) add(name string) {
	c.mu.Lock()
	c.calls = append(c.calls, name)
	c.mu.Unlock()
}

func (c *countingStore) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

func (c *countingStore) Claim(ctx context.Context, key string, ttl time.Duration) (store.ClaimState, []byte, string, error) {
	c.add("Claim")
	return c.Store.Claim(ctx, key, ttl)
}
func (c *countingStore) Complete(ctx context.Context, key, owner string, v []byte, ttl time.Duration) error {
	c.add("Complete")
	return c.Store.Complete(ctx, key, owner, v, ttl)
}
func (c *countingStore) Release(ctx context.Context, key, owner string) error {
	c.add("Release")
	return c.Store.Release(ctx, key, owner)
}
func (c *countingStore) Debit(ctx context.Context, id string, d store.Debit) (*handoffv1.Budget, error) {
	c.add("Debit")
	return c.Store.Debit(ctx, id, d)
}
func (c *countingStore) Wallet(ctx context.Context, id string) (*handoffv1.Budget, error) {
	c.add("Wallet")
	return c.Store.Wallet(ctx, id)
}

func (c *countingStore) WalletFor(ctx context.Context, id, job string) (*handoffv1.Budget, error) {
	c.add("WalletFor")
	return c.Store.WalletFor(ctx, id, job)
}
func (c *countingStore) Unpay(ctx context.Context, id, key string) error {
	c.add("Unpay")
	return c.Store.Unpay(ctx, id, key)
}
func (c *countingStore) Admit(ctx context.Context, key string, ttl time.Duration, id string, d store.Debit) (store.Admission, error) {
	c.add("Admit")
	return c.Store.Admit(ctx, key, ttl, id, d)
}

// TestHopStoreRoundTrips: an accepted delivery costs the store two calls, Admit (claim and
// hop debit together) and Complete; a refused debit is Admit and Release, with the agent not
// run; a re-delivery is charged nothing, while a stage delivered again after its agent
// failed is a new hop.
func TestHopStoreRoundTrips(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "counted.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for id, job := range map[string]string{"w-full": "job-1", "w-empty": "job-empty"} {
		hops := uint32(3)
		if id == "w-empty" {
			hops = 0
		}
		if _, err := st.OpenWallet(ctx, id, job, &handoffv1.Budget{UsdRemainingMicros: 9000, HopsRemaining: hops}); err != nil {
			t.Fatal(err)
		}
	}
	cs := &countingStore{Store: st}
	ag := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	e := start(t, agentrunner.Options{Store: cs, Agents: []agentrunner.Agent{ag}}, "")

	p := pkg("draft")
	p.Budget.WalletId = "w-full"
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("delivery: %v, %v", msgs, err)
	}
	if got := msgs[0].GetAck().GetWallet(); got.GetWalletId() != "w-full" || got.GetHopsRemaining() != 2 {
		t.Fatalf("ack.wallet = %v; want w-full with 2 hops left", got)
	}
	if calls := cs.take(); !slices.Equal(calls, []string{"Admit", "Complete"}) {
		t.Fatalf("store calls of an accepted hop = %v; want [Admit Complete]", calls)
	}

	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE ||
		msgs[0].GetAck().GetPrior().GetWalletId() != "w-full" || msgs[0].GetAck().GetWallet().GetHopsRemaining() != 2 {
		t.Fatalf("re-delivery: %v, %v; want DUPLICATE naming w-full, still 2 hops", msgs, err)
	}
	cs.take()

	p = pkg("draft")
	p.JobId = "job-empty"
	p.Budget.WalletId = "w-empty"
	msgs, err = deliver(t, e.client, &handoffv1.DeliverRequest{Package: p})
	if err != nil || len(msgs) != 1 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET {
		t.Fatalf("empty wallet: %v, %v; want REJECTED_BUDGET", msgs, err)
	}
	if fields, _ := reasonFields(msgs[0].GetAck()); !slices.Equal(fields, []string{"budget.hops_remaining"}) {
		t.Fatalf("reasons name %v; want only budget.hops_remaining", fields)
	}
	if calls := cs.take(); !slices.Equal(calls, []string{"Admit", "Release"}) {
		t.Fatalf("store calls of a refused hop = %v; want [Admit Release]", calls)
	}
	if n := ag.calls.Load(); n != 1 {
		t.Fatalf("agent ran %d times; want 1 (not for the duplicate or the empty wallet)", n)
	}
	if w, _ := st.Wallet(ctx, "w-full"); w.GetHopsRemaining() != 2 {
		t.Fatalf("w-full holds %d hops; want 2 (the duplicate is not charged)", w.GetHopsRemaining())
	}

	// A stage whose agent ran and failed is charged again when delivered again: the new
	// attempt is a new hop (a retry after a crash, with no result, is not: storetest Admit).
	var failOnce atomic.Bool
	failOnce.Store(true)
	flaky := &fake{card: agentrunner.RoleCard{Name: "review"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
		if failOnce.Swap(false) {
			return nil, errors.New("model overloaded")
		}
		return writeOne(ctx, in)
	}}
	e2 := start(t, agentrunner.Options{Store: cs, Agents: []agentrunner.Agent{flaky}}, "")
	p = pkg("review")
	p.Budget.WalletId = "w-full"
	cs.take()
	for i, want := range []handoffv1.StageStatus{handoffv1.StageStatus_STAGE_STATUS_FAILED, handoffv1.StageStatus_STAGE_STATUS_COMPLETED} {
		msgs, err := deliver(t, e2.client, &handoffv1.DeliverRequest{Package: p})
		if err != nil || len(msgs) != 2 || msgs[1].GetResult().GetStatus() != want {
			t.Fatalf("delivery %d of the flaky stage: %v, %v; want %s", i+1, msgs, err, want)
		}
		if got, wantHops := msgs[0].GetAck().GetWallet().GetHopsRemaining(), uint32(1-i); got != wantHops {
			t.Fatalf("delivery %d: ack.wallet has %d hops; want %d (each attempt that ran is a hop)", i+1, got, wantHops)
		}
	}
	if calls := cs.take(); !slices.Equal(calls, []string{"Admit", "Unpay", "Release", "Admit", "Complete"}) {
		t.Fatalf("store calls of a failed then repeated stage = %v; want [Admit Unpay Release Admit Complete]", calls)
	}
	if w, _ := st.Wallet(ctx, "w-full"); w.GetHopsRemaining() != 0 {
		t.Fatalf("w-full holds %d hops after a failed and a repeated run of one stage; want 0", w.GetHopsRemaining())
	}
}

// TestMergeKey: a merge's completion key names the set of branch results it merges. The
// same results (in any order) are the same key, so a re-delivered set merges once; a set
// without a branch, or with a branch's new result, is another.
func TestMergeKey(t *testing.T) {
	res := func(branch, uri string) *handoffv1.BranchResult {
		return &handoffv1.BranchResult{Branch: branch, Artifacts: []*handoffv1.Artifact{{Type: "notes", SchemaVersion: "notes.v1", Uri: uri}}}
	}
	a, b := res("policy", "file:///a"), res("history", "file:///b")
	base := agentrunner.MergeKey([]*handoffv1.BranchResult{a, b})
	tests := []struct {
		name string
		set  []*handoffv1.BranchResult
		same bool
	}{
		{"same set", []*handoffv1.BranchResult{res("policy", "file:///a"), res("history", "file:///b")}, true},
		{"other order", []*handoffv1.BranchResult{b, a}, true},
		{"a branch left out", []*handoffv1.BranchResult{a}, false},
		{"a branch's new result", []*handoffv1.BranchResult{a, res("history", "file:///b2")}, false},
		{"results under other branches", []*handoffv1.BranchResult{res("history", "file:///a"), res("policy", "file:///b")}, false},
	}
	for _, tt := range tests {
		if got := agentrunner.MergeKey(tt.set); (got == base) != tt.same {
			t.Errorf("%s: key %s vs %s, want same=%v", tt.name, got, base, tt.same)
		}
	}
}
