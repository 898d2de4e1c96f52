// Command llm-triage runs the triage pipeline with model stages on the whole platform in
// one process (coordinator, agent runner and writeback over loopback gRPC). The stages'
// tools come from an MCP server written in Go (tools.go), started as a stdio subprocess;
// the model is any OpenAI-compatible server (--base-url, --model, key in
// HANDOFF_LLM_API_KEY), or the scripted one of --fake-model, offline.
//
// It submits ticket T-1042 and prints, per stage as the runtime recorded it: the tool calls
// (name, ok or error code, duration), the transfer taken and the spend in micro-USD; then
// the one write the writeback made.
//
//	go run ./examples/llm-triage --fake-model
//	go run ./examples/llm-triage --base-url http://127.0.0.1:11434/v1 --model qwen2.5:7b
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
)

//go:embed pipeline.yaml
var pipelineYAML []byte

// toolsEnv makes the binary serve its MCP tools over stdio instead (how the pipeline's
// mcp_servers command runs it).
const toolsEnv = "HANDOFF_LLM_TRIAGE_TOOLS"

func main() {
	if os.Getenv(toolsEnv) == "stdio" {
		if err := toolServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "llm-triage tools:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "llm-triage:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("llm-triage", flag.ContinueOnError)
	fake := fs.Bool("fake-model", false, "use the scripted OpenAI-compatible server (offline, deterministic)")
	baseURL := fs.String("base-url", "", "OpenAI-compatible API base URL, e.g. http://127.0.0.1:11434/v1 (Ollama), http://127.0.0.1:8000/v1 (vLLM), https://api.openai.com/v1")
	model := fs.String("model", "", "model name as the server knows it")
	price := fs.Int64("price", 150, "micro-USD per 1000 tokens (prompt and completion) for a model the pipeline's prices: table does not list")
	budget := fs.Int64("budget", 200_000, "the job's wallet in micro-USD")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *fake {
		llm := testkit.NewLLM(fakeModel)
		defer llm.Close()
		*baseURL, *model = llm.URL, "fake-triage-model"
	}
	if *baseURL == "" || *model == "" {
		return errors.New("give --base-url and --model, or --fake-model")
	}

	p, problems, err := pipeline.Parse("pipeline.yaml", pipelineYAML)
	if err != nil || pipeline.HasErrors(problems) {
		return fmt.Errorf("pipeline: %v %v", err, problems)
	}
	// The tool server is this binary, run again as a stdio subprocess.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for i := range p.MCPServers {
		p.MCPServers[i].Command = []string{self}
	}
	os.Setenv(toolsEnv, "stdio") // inherited by the subprocess only: this process has read it
	defer os.Unsetenv(toolsEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tools, err := llmagent.ConnectMCP(ctx, p.MCPServers, nil)
	if err != nil {
		return err
	}
	defer tools.Close()

	rec := &recorder{}
	cfg := llmagent.Config{BaseURL: *baseURL, Model: *model, APIKey: os.Getenv("HANDOFF_LLM_API_KEY"), Temperature: 0,
		PriceMicrosPer1KTokens: *price, Prices: llmagent.PricesOf(p), MaxRetries: 2, Timeout: 2 * time.Minute}
	var agents []agentrunner.Agent
	for _, st := range p.Stages {
		if st.Kind == pipeline.KindWriteback {
			continue // the writeback service writes, not a model
		}
		builtin := map[string]string{"intake": "intake", "retrieve": "retrieve", "draft": "draft", "judge": "judge"}[st.Name]
		base, err := llmagent.StageRole(builtin)
		if err != nil {
			return err
		}
		role, err := llmagent.RoleFor(p, st.Name, base, tools)
		if err != nil {
			return err
		}
		a, err := llmagent.New(cfg, role)
		if err != nil {
			return err
		}
		agents = append(agents, rec.wrap(a))
	}

	dir, err := os.MkdirTemp("", "llm-triage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := stack.Start(ctx, stack.Config{
		DataDir: dir, CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Pipelines: map[string]*pipeline.Pipeline{p.Name: p}, Agents: agents,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	defer s.Close()
	cc, err := s.DialAs(s.CoordinatorAddr, "operator")
	if err != nil {
		return err
	}
	client := handoffv1.NewCoordinatorServiceClient(cc)
	raw, err := s.Artifacts.Put(ctx, artifact.Ref{JobID: "tkt_1042", Stage: "submit", Type: "raw_ticket", SchemaVersion: "raw_ticket.v1", MediaType: "application/json"},
		[]byte(`{"ticket_id":"T-1042","subject":"Charged twice for order 5512"}`))
	if err != nil {
		return err
	}
	resp, err := client.SubmitJob(ctx, &handoffv1.SubmitJobRequest{
		RequestId: "llm-triage-1", JobId: "tkt_1042", Pipeline: p.Name,
		Goal:        "Triage ticket T-1042 and record an internal summary in the CRM.",
		Constraints: []string{"never promise a refund", "cite a help-center key on every claim"},
		Budget:      &handoffv1.Budget{UsdRemainingMicros: *budget}, Inputs: []*handoffv1.Artifact{raw},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "llm-triage: model %s at %s; tools from MCP server %q (stdio)\n", *model, *baseURL, p.MCPServers[0].Name)
	fmt.Fprintf(out, "job %s  run %s  pipeline %s  wallet %d micro-USD\n", resp.GetJob().GetJobId(), resp.GetJob().GetRunId(), p.Name, *budget)
	var job *handoffv1.Job
	for {
		g, err := client.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		if err != nil {
			return err
		}
		if job = g.GetJob(); job.GetState() != handoffv1.JobState_JOB_STATE_RUNNING {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	rec.print(out)
	fmt.Fprintf(out, "\nstate %s, spent %d micro-USD in all\n", strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"), job.GetSpentUsdMicros())
	r := job.GetReceipt()
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || r.GetExternalId() == "" {
		if e := job.GetEscalation(); e != nil {
			fmt.Fprintf(out, "escalated %s at %s: %s\n", e.GetCause(), e.GetStage(), e.GetDetail())
		}
		return fmt.Errorf("the job ended %s without a write", job.GetState())
	}
	fmt.Fprintf(out, "write: 1, target %s, entry %s, key %s\n", r.GetTarget(), r.GetExternalId(), r.GetIdempotencyKey())
	if n := patches.Load(); n != 0 {
		return fmt.Errorf("a model stage called crm_patch %d times", n)
	}
	return nil
}

// recorder wraps each stage agent to print what the runtime recorded for it.
type recorder struct {
	mu   sync.Mutex
	runs []stageRun
}

type stageRun struct {
	stage string
	res   *handoffv1.StageResult
	err   error
}

type recorded struct {
	agentrunner.Agent
	r *recorder
}

func (r *recorder) wrap(a agentrunner.Agent) agentrunner.Agent { return &recorded{a, r} }

func (a *recorded) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	res, err := a.Agent.Run(ctx, in)
	a.r.mu.Lock()
	a.r.runs = append(a.r.runs, stageRun{in.Package.GetStage(), res, err})
	a.r.mu.Unlock()
	return res, err
}

func (r *recorder) print(out io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, sr := range r.runs {
		res := sr.res
		var re *agentrunner.RunError
		if sr.err != nil && errors.As(sr.err, &re) {
			res = &handoffv1.StageResult{SpentUsdMicros: re.SpentUsdMicros, ToolsTried: re.ToolsTried}
		}
		fmt.Fprintf(out, "\nstage %-9s spent %6d micro-USD\n", sr.stage, res.GetSpentUsdMicros())
		for _, t := range res.GetToolsTried() {
			outcome := "ok"
			if !t.GetOk() {
				outcome = t.GetErrorCode()
			}
			fmt.Fprintf(out, "  tool %-22s %-18s %4d ms\n", t.GetName(), outcome, t.GetDurationMs())
		}
		if rt := res.GetRoute(); rt != nil {
			fmt.Fprintf(out, "  transfer: %s (%s) %q\n", rt.GetName(), strings.ToLower(strings.TrimPrefix(rt.GetPriority().String(), "ROUTE_PRIORITY_")), rt.GetReason())
		} else if sr.err == nil {
			fmt.Fprintln(out, "  transfer: none (the pipeline's order)")
		}
		if sr.err != nil {
			fmt.Fprintf(out, "  FAILED: %v\n", sr.err)
		}
	}
}
