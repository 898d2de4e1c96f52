// Command agentrunner serves handoff.v1.AgentRunnerService with the built-in support agents
// (intake, retrieve, draft, judge), server reflection and gRPC health, behind the platform's
// interceptor chain (internal/server with the runner's enforcement: schema, role, stage
// de-duplication, the job's wallet).
//
// Every flag has an environment fallback; flags win. Optionally, stages can be served by an
// OpenAI-compatible model (--llm-stages draft,judge) or by a program (--exec).
//
// Transport security is required: --certs DIR (mTLS with the certificates `handoff certs`
// made) or --plaintext-loopback on a loopback --listen address (callers then prove who they
// are with service tokens, checked with the public keys in --token-public-keys). --store is a bbolt file, or
// redis://[:password@]host:port[/db][?prefix=P] (or redis-cluster://host:port,host:port,...)
// so that several runners (and the
// coordinator) share one set of completion records and wallets (store.OpenURL reads it).
// The runner pays each hop from the wallet the coordinator opened, so it needs the
// coordinator's store: a package whose wallet is not in it (a bbolt file of the runner's
// own) is refused, REJECTED_BUDGET naming budget.wallet_id.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/gctune"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/execagent"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

// service is this binary's identity: its certificate name, its name in logs, traces and
// metrics.
const service = "agentrunner"

const (
	about   = "hosts stage agents behind the AgentRunnerService: every package is checked (schema, role, duplicate, the job's wallet) and acked before its agent runs"
	details = `Serves the built-in support agents (intake, retrieve, draft, judge); --llm-stages puts
an OpenAI-compatible model on some of them (with --llm-pipeline: stages of that pipeline,
their tools from its MCP servers), --exec a program. Needs transport security
(--certs DIR, or --plaintext-loopback on a loopback --listen address) and the coordinator's
--store: a package whose wallet is not in it is REJECTED_BUDGET naming budget.wallet_id.`
)

// Defaults of the runner's own settings.
const (
	defaultStore      = "./handoff-data/agentrunner.db"
	defaultLLMBaseURL = "https://api.openai.com/v1"
	// stopMargin is added to --stage-timeout to bound a graceful stop: a stage that started
	// just before the stop may finish and send its result.
	stopMargin = 5 * time.Second
)

// settings are the runner's configuration, from flags with HANDOFF_* fallbacks.
type settings struct {
	listen                                     server.Listen
	storeSpec, artifactsDir                    string
	stageTimeout, resultTTL, storeWait         time.Duration
	llmStages, llmBaseURL, llmModel, llmAPIKey string
	llmPipeline                                string
	llmPrice                                   int
	execAgents                                 []string
	otelGenAI                                  bool
	sec                                        rpc.Security
}

// Bind registers every setting with its variable and default.
func (s *settings) Bind(b *config.Binder) {
	s.listen.Bind(b, "HANDOFF_AGENTRUNNER_LISTEN", server.RunnerAddr)
	b.String(&s.storeSpec, "store", "HANDOFF_STORE", defaultStore,
		"stage-completion records and the coordinator's wallets: a bbolt file, or redis://[:password@]host:port[/db][?prefix=P] or redis-cluster://host:port,host:port,...[?prefix=P] shared with the coordinator (a package whose wallet is not in this store is REJECTED_BUDGET)")
	b.String(&s.artifactsDir, "artifacts", "HANDOFF_ARTIFACTS", server.Artifacts, "artifact folder, shared with the other services")
	b.Duration(&s.storeWait, "store-wait", "HANDOFF_STORE_WAIT", server.DefaultStoreWait, "at start-up, how long to keep trying a Redis store that does not answer yet (0: fail at once)")
	b.Duration(&s.stageTimeout, "stage-timeout", "HANDOFF_STAGE_TIMEOUT", agentrunner.DefaultStageTimeout, "bound on one agent run")
	b.Duration(&s.resultTTL, "result-ttl", "HANDOFF_RESULT_TTL", 0, "how long stage-completion records are kept, 0 = forever")
	b.String(&s.llmStages, "llm-stages", "HANDOFF_LLM_STAGES", "", "comma-separated support stages served by an OpenAI-compatible model instead of the built-in agents")
	b.String(&s.llmPipeline, "llm-pipeline", "HANDOFF_LLM_PIPELINE", "", "pipeline file the --llm-stages are stages of: their tools (from its MCP servers), instructions, max_tool_rounds and output schema; without it they are the built-in support roles with no tools")
	b.String(&s.llmBaseURL, "llm-base-url", "HANDOFF_LLM_BASE_URL", defaultLLMBaseURL, "OpenAI-compatible API base URL; the key is read from HANDOFF_LLM_API_KEY only")
	b.String(&s.llmModel, "llm-model", "HANDOFF_LLM_MODEL", "", "model name")
	b.Int(&s.llmPrice, "llm-price", "HANDOFF_LLM_PRICE_MICROS_PER_1K", 0, "micro-USD per 1000 tokens, for a model the --llm-pipeline's prices: table does not list")
	b.Secret(&s.llmAPIKey, "HANDOFF_LLM_API_KEY", "the model API's key, for --llm-stages (never a flag: it would show in the process list)")
	b.List(&s.execAgents, "exec", "HANDOFF_EXEC_AGENTS", ";", `serve a role by a program: "name[:tool,tool]=/path/to/program arg..."`)
	b.Bool(&s.otelGenAI, "otel-genai", "HANDOFF_OTEL_GENAI", false, "add the OpenTelemetry GenAI spans (invoke_agent per agent run, execute_tool per tool call of an LLM stage; Development-stability conventions) beside the handoff.* spans")
	s.sec.Bind(b)
}

// Validate checks the values, naming the flag of a bad one.
func (s *settings) Validate() error {
	if err := s.listen.Validate(); err != nil {
		return err
	}
	if _, err := store.ParseURL(s.storeSpec); err != nil {
		return fmt.Errorf("--store: %v", err)
	}
	if s.artifactsDir == "" {
		return errors.New("--artifacts: must not be empty")
	}
	if s.stageTimeout <= 0 {
		return fmt.Errorf("--stage-timeout must be positive, got %s", s.stageTimeout)
	}
	if s.llmPrice < 0 {
		return fmt.Errorf("--llm-price must not be negative, got %d", s.llmPrice)
	}
	return nil
}

func main() {
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, nil)))
	store.RouteRedisLogs(log)
	gctune.Start(service, log)
	if err := run(os.Args[1:], log); err != nil {
		fmt.Fprintln(os.Stderr, "agentrunner:", err)
		os.Exit(1)
	}
}

// parse reads the settings from args and the environment; --help goes to out.
func parse(args []string, out io.Writer) (*settings, error) {
	var s settings
	return &s, config.Load(service, out, about, details, &s, args)
}

func run(args []string, log *slog.Logger) error {
	s, err := parse(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	// Security first: a runner never serves without an identity check.
	creds, authz, err := s.sec.Server(service, s.listen.Addr)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var lp *pipeline.Pipeline
	var tools *llmagent.MCP
	if s.llmPipeline != "" && strings.TrimSpace(s.llmStages) != "" {
		if lp, err = pipeline.Load(s.llmPipeline); err != nil {
			return fmt.Errorf("--llm-pipeline: %w", err)
		}
		if tools, err = llmagent.ConnectMCP(ctx, lp.MCPServers, nil); err != nil {
			return fmt.Errorf("--llm-pipeline %s: %w", s.llmPipeline, err)
		}
		defer tools.Close()
	}
	cfg := llmagent.Config{
		BaseURL: s.llmBaseURL, Model: s.llmModel, APIKey: s.llmAPIKey,
		PriceMicrosPer1KTokens: int64(s.llmPrice), Timeout: s.stageTimeout,
		MaxRetries: 2, // 429 and 5xx, with backoff; past that the stage fails
	}
	if lp != nil {
		cfg.Prices = llmagent.PricesOf(lp) // the pipeline's table wins over --llm-price
	}
	agents, err := buildAgents(s.llmStages, cfg, lp, tools, s.execAgents, s.stageTimeout)
	if err != nil {
		return err
	}

	st, err := store.OpenURLWait(ctx, s.storeSpec, s.storeWait, store.LogRetries(log, s.storeSpec))
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	defer st.Close()
	arts, err := artifact.NewFiles(s.artifactsDir)
	if err != nil {
		return fmt.Errorf("--artifacts: %w", err)
	}
	v, err := contract.NewValidator()
	if err != nil {
		return err
	}
	srv, err := agentrunner.New(agentrunner.Options{
		Validator: v, Store: st, Artifacts: arts, Agents: agents,
		StageTimeout: s.stageTimeout, ResultTTL: s.resultTTL, Logger: log, GenAISpans: s.otelGenAI,
	})
	if err != nil {
		return err
	}

	tp, err := telemetry.NewTracerProvider(ctx, service)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("agentrunner: flushing traces failed", "err", err)
		}
	}()
	// The store holds the claims and wallets every delivery needs: health follows it. A
	// stop lets running stages finish (unfinished claims expire after the claim TTL).
	reg := telemetry.NewRegistry()
	gs, err := server.New(srv.Service(),
		server.WithSecurity(creds, authz), server.WithLogger(log), server.WithTracerProvider(tp),
		server.WithMetrics(reg), server.WithHealthFrom(st, server.DefaultHealthInterval),
		server.WithStopTimeout(s.stageTimeout+stopMargin))
	if err != nil {
		return err
	}

	lis, m, err := s.listen.Open(reg, log)
	if err != nil {
		return err
	}
	defer m.Close()
	names := make([]string, 0, len(agents))
	for _, a := range agents {
		names = append(names, a.Card().Name)
	}
	transport := "mtls"
	if creds == nil {
		transport = "plaintext-loopback"
	}
	log.Info("agentrunner: serving", "addr", lis.Addr().String(), "agents", strings.Join(names, ","),
		"store", store.Redact(s.storeSpec), "artifacts", arts.Root(), "stage_timeout", s.stageTimeout,
		"transport", transport, "metrics", s.listen.Metrics)
	return gs.Run(ctx, lis)
}

// buildAgents returns the built-in support agents, with the --llm-stages replaced by model
// agents, plus the --exec programs (which replace a built-in agent of the same name). With
// a pipeline p, each --llm-stages entry is one of its stages, its card the stage's agent
// name and exactly its catalogue tools, served by the MCP servers in tools.
func buildAgents(llmStages string, cfg llmagent.Config, p *pipeline.Pipeline, tools *llmagent.MCP, execs []string, timeout time.Duration) ([]agentrunner.Agent, error) {
	byName := map[string]agentrunner.Agent{}
	var order []string
	set := func(a agentrunner.Agent) {
		n := a.Card().Name
		if _, ok := byName[n]; !ok {
			order = append(order, n)
		}
		byName[n] = a
	}
	for _, a := range support.Agents() {
		set(a)
	}
	for _, stage := range strings.Split(llmStages, ",") {
		if stage = strings.TrimSpace(stage); stage == "" {
			continue
		}
		role, err := llmRole(stage, p, tools)
		if err != nil {
			return nil, fmt.Errorf("--llm-stages %s: %w", stage, err)
		}
		a, err := llmagent.New(cfg, role)
		if err != nil {
			return nil, fmt.Errorf("--llm-stages %s: %w", stage, err)
		}
		set(a)
	}
	for _, spec := range execs {
		head, cmdline, ok := strings.Cut(spec, "=")
		argv := strings.Fields(cmdline)
		if !ok || len(argv) == 0 {
			return nil, fmt.Errorf("--exec %q: want name[:tool,tool]=/path/to/program [arg ...]", spec)
		}
		name, tools, _ := strings.Cut(head, ":")
		card := agentrunner.RoleCard{Name: strings.TrimSpace(name)}
		for _, t := range strings.Split(tools, ",") {
			if t = strings.TrimSpace(t); t != "" {
				card.Tools = append(card.Tools, t)
			}
		}
		a, err := execagent.New(card, argv, timeout, nil)
		if err != nil {
			return nil, fmt.Errorf("--exec %q: %w", spec, err)
		}
		set(a)
	}
	out := make([]agentrunner.Agent, 0, len(order))
	for _, n := range order {
		out = append(out, byName[n])
	}
	return out, nil
}

// llmRole is a --llm-stages entry's role: the built-in support role of that name, or with
// a pipeline the stage's own (the built-in role of its agent, if any, under what the
// pipeline declares; a stage with no built-in role needs instructions:).
func llmRole(stage string, p *pipeline.Pipeline, tools *llmagent.MCP) (llmagent.Role, error) {
	if p == nil {
		return llmagent.StageRole(stage)
	}
	st, _, ok := p.Stage(stage)
	if !ok {
		return llmagent.Role{}, fmt.Errorf("pipeline %s has no stage %q", p.Name, stage)
	}
	base, err := llmagent.StageRole(st.AgentName())
	if err != nil {
		if st.Instructions == "" {
			return llmagent.Role{}, fmt.Errorf("stage %s has no built-in role (agent %s) and no instructions: in the pipeline", stage, st.AgentName())
		}
		base = llmagent.Role{Output: llmagent.Output{MediaType: "text/plain"}}
		if st.Output.JSONSchema != "" {
			base.Output.MediaType = "application/json"
		}
	}
	return llmagent.RoleFor(p, stage, base, tools)
}
