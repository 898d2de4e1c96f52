// Command agentrunner serves handoff.v1.AgentRunnerService with the built-in support agents
// (intake, retrieve, draft, judge), server reflection and gRPC health.
//
// Every flag has an environment fallback; flags win. Optionally, stages can be served by an
// OpenAI-compatible model (--llm-stages draft,judge) or by a program (--exec).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/services/agentrunner"
	"github.com/handoffhq/handoff/services/agentrunner/execagent"
	"github.com/handoffhq/handoff/services/agentrunner/llmagent"
	"github.com/handoffhq/handoff/services/agentrunner/support"
)

func env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v := os.Getenv(key); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		fmt.Fprintf(os.Stderr, "agentrunner: ignoring %s=%q: not a duration\n", key, v)
	}
	return def
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, "; ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agentrunner:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		listen       = flag.String("listen", env("HANDOFF_AGENTRUNNER_LISTEN", "127.0.0.1:50052"), "gRPC listen address (env HANDOFF_AGENTRUNNER_LISTEN)")
		storePath    = flag.String("store", env("HANDOFF_STORE", "./handoff-data/agentrunner.db"), "bbolt file for stage-completion records (env HANDOFF_STORE)")
		artifactsDir = flag.String("artifacts", env("HANDOFF_ARTIFACTS", "./handoff-data/artifacts"), "artifact folder, shared with the other services (env HANDOFF_ARTIFACTS)")
		stageTimeout = flag.Duration("stage-timeout", envDuration("HANDOFF_STAGE_TIMEOUT", agentrunner.DefaultStageTimeout), "bound on one agent run (env HANDOFF_STAGE_TIMEOUT)")
		resultTTL    = flag.Duration("result-ttl", envDuration("HANDOFF_RESULT_TTL", 0), "how long stage-completion records are kept, 0 = forever (env HANDOFF_RESULT_TTL)")
		llmStages    = flag.String("llm-stages", env("HANDOFF_LLM_STAGES", ""), "comma-separated support stages served by an OpenAI-compatible model instead of the built-in agents (env HANDOFF_LLM_STAGES)")
		llmBaseURL   = flag.String("llm-base-url", env("HANDOFF_LLM_BASE_URL", "https://api.openai.com/v1"), "OpenAI-compatible API base URL (env HANDOFF_LLM_BASE_URL); the key is read from HANDOFF_LLM_API_KEY only")
		llmModel     = flag.String("llm-model", env("HANDOFF_LLM_MODEL", ""), "model name (env HANDOFF_LLM_MODEL)")
		llmPrice     = flag.Int64("llm-price", 0, "micro-USD per 1000 tokens (env HANDOFF_LLM_PRICE_MICROS_PER_1K)")
		execAgents   multi
	)
	flag.Var(&execAgents, "exec", `serve a role by a program: "name[:tool,tool]=/path/to/program arg..." (repeatable; env HANDOFF_EXEC_AGENTS, entries separated by ";")`)
	flag.Parse()
	if v := os.Getenv("HANDOFF_LLM_PRICE_MICROS_PER_1K"); v != "" && !flagSet("llm-price") {
		p, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("HANDOFF_LLM_PRICE_MICROS_PER_1K=%q: %w", v, err)
		}
		*llmPrice = p
	}
	if len(execAgents) == 0 && os.Getenv("HANDOFF_EXEC_AGENTS") != "" {
		for _, e := range strings.Split(os.Getenv("HANDOFF_EXEC_AGENTS"), ";") {
			if e = strings.TrimSpace(e); e != "" {
				execAgents = append(execAgents, e)
			}
		}
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	agents, err := buildAgents(*llmStages, llmagent.Config{
		BaseURL: *llmBaseURL, Model: *llmModel, APIKey: os.Getenv("HANDOFF_LLM_API_KEY"),
		PriceMicrosPer1KTokens: *llmPrice, Timeout: *stageTimeout,
	}, execAgents, *stageTimeout)
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(*storePath), 0o755); err != nil {
		return err
	}
	st, err := store.Open(*storePath)
	if err != nil {
		return err
	}
	defer st.Close()
	arts, err := artifact.NewFiles(*artifactsDir)
	if err != nil {
		return err
	}
	v, err := contract.NewValidator()
	if err != nil {
		return err
	}
	srv, err := agentrunner.New(agentrunner.Options{
		Validator: v, Store: st, Artifacts: arts, Agents: agents,
		StageTimeout: *stageTimeout, ResultTTL: *resultTTL, Logger: log,
	})
	if err != nil {
		return err
	}
	gs, hs := agentrunner.NewGRPCServer(srv)

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(agents))
	for _, a := range agents {
		names = append(names, a.Card().Name)
	}
	log.Info("agentrunner: serving", "addr", lis.Addr().String(), "agents", strings.Join(names, ","),
		"store", *storePath, "artifacts", arts.Root(), "stage_timeout", *stageTimeout)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("agentrunner: stopping; finishing running stages", "grace", *stageTimeout+5*time.Second)
	hs.Shutdown()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(*stageTimeout + 5*time.Second):
		log.Warn("agentrunner: grace period over; stopping now (unfinished claims expire after the claim TTL)")
		gs.Stop()
	}
	if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// buildAgents returns the built-in support agents, with the --llm-stages replaced by model
// agents, plus the --exec programs (which replace a built-in agent of the same name).
func buildAgents(llmStages string, cfg llmagent.Config, execs []string, timeout time.Duration) ([]agentrunner.Agent, error) {
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
		role, err := llmagent.StageRole(stage)
		if err != nil {
			return nil, err
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
			return nil, fmt.Errorf("--exec %q: want name[:tool,tool]=/path/to/program arg...", spec)
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
