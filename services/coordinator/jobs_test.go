package coordinator_test

// What keeps jobs apart, end to end on real gRPC over loopback: a package pays only from its
// own job's wallet, job_id is not first-come, and a submitted input is the job's own or
// pinned by a digest.

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/demo"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// badField is the field of err's google.rpc.BadRequest detail, "" when it has none.
func badField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// reasonFieldsOf lists the fields an escalation's reasons name.
func reasonFieldsOf(job *handoffv1.Job) []string {
	var out []string
	for _, r := range job.GetEscalation().GetReasons() {
		out = append(out, r.GetField())
	}
	return out
}

// TestPackageNamingAnotherJobsWallet: a package of job X whose budget names job Y's wallet
// (here forged on the way out) is REJECTED_BUDGET naming budget.wallet_id at the runner:
// X escalates, no agent runs for it, and Y's wallet keeps every hop. A wallet_id the store
// does not hold is refused the same way.
func TestPackageNamingAnotherJobsWallet(t *testing.T) {
	var mu sync.Mutex
	forged := map[string]string{} // job_id -> the wallet_id its packages are made to name
	tamper := func(p *handoffv1.HandoffPackage) {
		mu.Lock()
		defer mu.Unlock()
		if id, ok := forged[p.GetJobId()]; ok {
			p.Budget.WalletId = id
		}
	}
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, tamper)
	ctx := context.Background()
	y, _ := e.submit(t, "relay", "tkt_y", "", e.defaultBudget)
	if y.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job Y ended %s", y.GetState())
	}
	yWallet, err := e.st.Store.Wallet(ctx, y.GetRunId())
	if err != nil {
		t.Fatal(err)
	}
	calls := e.draft.calls() + e.judge.calls()

	for job, id := range map[string]string{"tkt_x": y.GetRunId(), "tkt_z": "run_00000000000000ff"} {
		mu.Lock()
		forged[job] = id
		mu.Unlock()
		x, evs := e.submit(t, "relay", job, "", e.defaultBudget)
		if x.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || x.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_BUDGET {
			t.Fatalf("%s naming wallet %s: %s %v; want ESCALATED on REJECTED_BUDGET\ntimeline %v", job, id, x.GetState(), x.GetEscalation(), kinds(evs))
		}
		if f := reasonFieldsOf(x); !slices.Equal(f, []string{"budget.wallet_id"}) {
			t.Fatalf("%s: escalation reasons name %v; want [budget.wallet_id]", job, f)
		}
		for _, r := range x.GetEscalation().GetReasons() {
			if strings.Contains(r.GetMessage(), "tkt_y") || strings.Contains(r.GetMessage(), fmt.Sprint(yWallet.GetUsdRemainingMicros())) {
				t.Fatalf("%s: the reason %q shows job Y's wallet", job, r.GetMessage())
			}
		}
	}
	if n := e.draft.calls() + e.judge.calls(); n != calls {
		t.Fatalf("agents ran %d more times for packages paying from another job's wallet; want 0", n-calls)
	}
	if got, err := e.st.Store.Wallet(ctx, y.GetRunId()); err != nil || !proto.Equal(got, yWallet) {
		t.Fatalf("job Y's wallet = %v, %v; want it untouched (%v)", got, err, yWallet)
	}
	if e.writes(t) != 1 {
		t.Fatalf("%d writes; want Y's one", e.writes(t))
	}
}

// TestJobIDNotFirstCome: ten submissions of one job_id with ten goals, at once: one run,
// nine AlreadyExists naming job_id (not nine runs answered DUPLICATE at every hop). The
// winner's content submitted again is the idempotent repeat: every hop DUPLICATE, one write.
func TestJobIDNotFirstCome(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var won []*handoffv1.SubmitJobRequest
	var runs []string
	refused := 0
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			req := e.request("relay", "tkt_10", fmt.Sprintf("req-%d", i), e.defaultBudget)
			req.Goal = fmt.Sprintf("goal number %d", i)
			resp, err := e.client.SubmitJob(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won, runs = append(won, req), append(runs, resp.GetJob().GetRunId())
			case status.Code(err) == codes.AlreadyExists && strings.Contains(err.Error(), "job_id") && badField(err) == "job_id":
				refused++
			default:
				t.Errorf("submission %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 || refused != 9 {
		t.Fatalf("10 submissions of one job_id with 10 goals: %d accepted, %d AlreadyExists; want 1 and 9", len(won), refused)
	}
	first, err := demo.Watch(ctx, e.client, runs[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	if kinds(first)[len(first)-1] != "writeback:COMPLETED" {
		t.Fatalf("the accepted run: %v", kinds(first))
	}
	// The same content again, under a new request id: a repeat that writes nothing again.
	again := proto.Clone(won[0]).(*handoffv1.SubmitJobRequest)
	again.RequestId = "req-again"
	resp, err := e.client.SubmitJob(ctx, again)
	if err != nil {
		t.Fatalf("the accepted content again: %v", err)
	}
	evs, err := demo.Watch(ctx, e.client, resp.GetJob().GetRunId(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.GetKind() == handoffv1.EventKind_EVENT_KIND_ACK && ev.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_DUPLICATE {
			t.Fatalf("repeat run ack %s at %s; want DUPLICATE at every hop\n%v", ev.GetAck().GetStatus(), ev.GetStage(), kinds(evs))
		}
	}
	if n := e.writes(t); n != 1 {
		t.Fatalf("%d writes for one job; want 1", n)
	}
	if e.draft.calls() != 1 {
		t.Fatalf("draft ran %d times; want once for the one job", e.draft.calls())
	}
}

// TestSubmittedInputMustBeItsJobs: an input must be stored in its own job's folder under the
// artifact root, or carry the sha256 its reader checks; otherwise SubmitJob is
// InvalidArgument naming the input's uri, and no run starts.
func TestSubmittedInputMustBeItsJobs(t *testing.T) {
	e := start(t, 10, 2, []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	ctx := context.Background()
	put := func(job string) *handoffv1.Artifact {
		a, err := e.st.Artifacts.Put(ctx, artifact.Ref{JobID: job, Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, support.SampleTicket())
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	unpinned := func(a *handoffv1.Artifact) *handoffv1.Artifact {
		a = proto.Clone(a).(*handoffv1.Artifact)
		a.Sha256 = ""
		return a
	}
	at := func(uri string) *handoffv1.Artifact {
		return &handoffv1.Artifact{Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", Uri: uri}
	}
	root := e.st.Artifacts.Root()
	own, others := put("tkt_in"), put("tkt_other")
	for name, inputs := range map[string][]*handoffv1.Artifact{
		"a file outside the root":  {at("file:///etc/passwd")},
		"another job's input":      {unpinned(others)},
		"the root itself":          {at("file://" + filepath.ToSlash(filepath.Join(root, "x.json")))},
		"out of its folder by ..":  {at("file://" + filepath.ToSlash(root) + "/tkt_in/../tkt_other/submit-r0/raw_ticket.json")},
		"a job whose id starts so": {at("file://" + filepath.ToSlash(root) + "/tkt_inner/x.json")},
		"not a file":               {at("https://example.com/tkt_in/x.json")},
	} {
		req := e.request("relay", "tkt_in", "", e.defaultBudget)
		req.Inputs = inputs
		_, err := e.client.SubmitJob(ctx, req)
		if status.Code(err) != codes.InvalidArgument || badField(err) != "inputs[0].uri" || !strings.Contains(err.Error(), "inputs[0].uri") {
			t.Fatalf("%s: SubmitJob = %v; want InvalidArgument naming inputs[0].uri", name, err)
		}
		if strings.Contains(err.Error(), root) {
			t.Fatalf("%s: the error %q shows the artifact root", name, err)
		}
	}
	// The second input is named when it is the bad one.
	req := e.request("relay", "tkt_in", "", e.defaultBudget)
	req.Inputs = []*handoffv1.Artifact{unpinned(own), at("file:///etc/passwd")}
	if _, err := e.client.SubmitJob(ctx, req); status.Code(err) != codes.InvalidArgument || badField(err) != "inputs[1].uri" {
		t.Fatalf("bad second input: %v; want InvalidArgument naming inputs[1].uri", err)
	}
	if runs, err := e.client.ListJobs(ctx, &handoffv1.ListJobsRequest{}); err != nil || len(runs.GetJobs()) != 0 {
		t.Fatalf("refused submissions started runs: %v, %v", runs.GetJobs(), err)
	}
	// Accepted: the job's own input without a digest, and anything pinned by one (whose
	// reader then checks the bytes against it).
	for _, c := range []struct {
		name, job string
		in        *handoffv1.Artifact
	}{
		{"its own, unpinned", "tkt_in", unpinned(own)},
		{"another job's, pinned", "tkt_in_2", others},
		{"a pinned URL", "tkt_in_3", &handoffv1.Artifact{Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", Uri: "https://example.com/t.json", Sha256: others.GetSha256()}},
	} {
		req := e.request("relay", c.job, "", e.defaultBudget)
		req.Inputs = []*handoffv1.Artifact{c.in}
		if _, err := e.client.SubmitJob(ctx, req); err != nil {
			t.Fatalf("%s: SubmitJob = %v; want accepted", c.name, err)
		}
	}
}
