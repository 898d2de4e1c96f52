package llmagent_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

const pingPong = `name: pingpong
max_hops: 20
max_bounces: 2
escalation: {route: leads}
stages:
  - name: sort
    input: raw_ticket.v1
    output: {type: intake, schema_version: intake.v1}
    criteria: [sorted]
    routes:
      - {name: resort, description: "Another desk should sort this ticket.", to: resort}
      - {name: done, description: "The ticket is sorted.", to: end}
  - name: resort
    input: intake.v1
    output: {type: intake, schema_version: intake.v1}
    criteria: [resorted]
    routes:
      - {name: sort, description: "The first desk should sort this ticket.", to: sort}
      - {name: done, description: "The ticket is sorted.", to: end}
`

// TestPingPongLLMStages: two model stages that keep transferring to each other run on the
// real rail (coordinator, runner, writeback over gRPC) until it escalates PING_PONG; each
// stage's transfer is the route the rail saw. A package the runner rejects makes no model
// call.
func TestPingPongLLMStages(t *testing.T) {
	p, problems, err := pipeline.Parse("pingpong.yaml", []byte(pingPong))
	if err != nil || pipeline.HasErrors(problems) {
		t.Fatalf("%v %v", err, problems)
	}
	intake := `{"artifact": {"ticket_id": "T-1", "category": "general"}, "next_hint": "over to you"}`
	llm := testkit.ServeLLM(t, func(_ int, req testkit.LLMRequest) testkit.Step {
		sys, _ := req.Messages[0]["content"].(string)
		to := "transfer_to_sort"
		if strings.Contains(sys, `"sort" stage`) {
			to = "transfer_to_resort"
		}
		return testkit.Step{Content: intake, Calls: []testkit.Call{{Name: to, Args: `{"reason":"not mine"}`}}, PromptTokens: 100, CompletionTokens: 50}
	})
	var agents []agentrunner.Agent
	for _, stage := range []string{"sort", "resort"} {
		base, _ := llmagent.StageRole("intake")
		role, err := llmagent.RoleFor(p, stage, base, nil)
		if err != nil {
			t.Fatal(err)
		}
		a, err := llmagent.New(llmagent.Config{BaseURL: llm.URL, Model: "m", PriceMicrosPer1KTokens: 100}, role)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	ctx := context.Background()
	st, err := stack.Start(ctx, stack.Config{
		DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines: map[string]*pipeline.Pipeline{"pingpong": p}, Agents: agents,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.DialAs(st.CoordinatorAddr, "operator")
	if err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	in, err := st.Artifacts.Put(ctx, artifact.Ref{JobID: "tkt_1", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"}, []byte(`{"ticket_id":"T-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		JobId: "tkt_1", Pipeline: "pingpong", Goal: "sort the ticket", Constraints: []string{"be brief"},
		Budget: &handoffv1.Budget{UsdRemainingMicros: 1_000_000}, Inputs: []*handoffv1.Artifact{in},
	})
	if err != nil {
		t.Fatal(err)
	}
	var job *handoffv1.Job
	testkit.Eventually(t, 20*time.Second, "the run to stop", func() bool {
		g, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		job = g.GetJob()
		return err == nil && job.GetState() != handoffv1.JobState_JOB_STATE_RUNNING
	})
	if job.GetState() != handoffv1.JobState_JOB_STATE_ESCALATED || job.GetEscalation().GetCause() != handoffv1.EscalationCause_ESCALATION_CAUSE_PING_PONG {
		t.Fatalf("state %s escalation %v", job.GetState(), job.GetEscalation())
	}
	var moves []string
	for _, tr := range job.GetTransfers() {
		moves = append(moves, tr.GetFromStage()+">"+tr.GetRoute().GetName())
	}
	if got := strings.Join(moves, " "); got != "sort>resort resort>sort sort>resort" {
		t.Fatalf("moves %q", got)
	}
	calls := len(llm.Requests())
	if calls != 4 {
		t.Fatalf("%d model calls, want 4 (two visits of each stage)", calls)
	}
	// The runtime's record of each hop's transfer reaches the job.
	n := 0
	for _, at := range job.GetToolsTried() {
		if strings.HasPrefix(at.GetName(), "transfer_to_") && at.GetOk() {
			n++
		}
	}
	if n != 4 {
		t.Errorf("job tools_tried %v: want the 4 transfers", job.GetToolsTried())
	}

	// A package the runner rejects (a wallet that is not the job's) makes no model call.
	rc, err := st.DialAs(st.RunnerAddr, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	pkg := testkit.Package(testkit.AtStage("sort"), testkit.OfJob("tkt_2"))
	pkg.Budget.WalletId = "w_nobody"
	stream, err := handoffv1.NewAgentRunnerServiceClient(rc).Deliver(ctx, &handoffv1.DeliverRequest{Package: pkg})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET {
		t.Fatalf("ack %v err %v; want REJECTED_BUDGET", first, err)
	}
	if len(llm.Requests()) != calls {
		t.Fatal("a rejected package made a model call")
	}
}
