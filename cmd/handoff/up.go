package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/signal"
	"slices"
	"syscall"

	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/telemetry"
)

// stackFlags are the settings `up` and `demo` share.
type stackFlags struct {
	data, coordinator, runner, writeback, webhook, metrics string
	verbose, otelGenAI                                     bool
}

func bindStack(b *config.Binder, f *stackFlags, defData, defCoord, defRunner, defWB, defMetrics string) {
	b.String(&f.data, "data", "HANDOFF_DATA", defData, "folder for the embedded store and the artifacts")
	b.String(&f.coordinator, "coordinator-listen", "HANDOFF_COORDINATOR_LISTEN", defCoord, "coordinator gRPC address")
	b.String(&f.runner, "agentrunner-listen", "HANDOFF_AGENTRUNNER_LISTEN", defRunner, "agent runner gRPC address")
	b.String(&f.writeback, "writeback-listen", "HANDOFF_WRITEBACK_LISTEN", defWB, "writeback gRPC address")
	b.String(&f.webhook, "webhook-url", "HANDOFF_WEBHOOK_URL", "", "add a 'webhook' writeback target posting to this URL")
	b.String(&f.metrics, "metrics-listen", "HANDOFF_METRICS_LISTEN", defMetrics, "serve Prometheus metrics at http://ADDR/metrics (empty: off)")
	b.Bool(&f.verbose, "v", "HANDOFF_VERBOSE", false, "log every call (JSON on stderr)")
	b.Bool(&f.otelGenAI, "otel-genai", "HANDOFF_OTEL_GENAI", false, "add the OpenTelemetry GenAI spans (invoke_agent per agent run, execute_tool per tool call of an LLM stage; Development-stability conventions) beside the handoff.* spans")
}

func (f *stackFlags) config(stderr io.Writer) stack.Config {
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	return stack.Config{
		DataDir: f.data, CoordinatorAddr: f.coordinator, RunnerAddr: f.runner, WritebackAddr: f.writeback,
		WebhookURL: f.webhook, GenAISpans: f.otelGenAI,
		Logger: slog.New(telemetry.LogHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))),
	}
}

func runUp(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return up(ctx, args, stdout, stderr)
}

// up is `handoff up` until ctx ends.
func up(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("handoff up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, about("up")+"Usage: handoff up [flags]\n\nRuns the coordinator, agent runner and writeback on loopback in one process, on the\nembedded store (no Redis), with gRPC reflection and health on each, until Ctrl-C.\n\nFlags:")
		printDefaultsExcept(fs, stderr, testOnlyUpFlags)
	}
	var f stackFlags
	// Test-only, left out of --help and without an environment variable, refused by a
	// build without -tags crashpoints and off loopback (testViaAddr): the addresses the
	// coordinator dials for the agent runner and the writeback, instead of their own
	// listeners. `handoff chaos --store bbolt` puts its hop proxy there.
	var runnerVia, wbVia string
	fs.StringVar(&runnerVia, flagTestRunnerVia, "", "")
	fs.StringVar(&wbVia, flagTestWritebackVia, "", "")
	var webAddr, opToken, operators, operatorsFile, pipelines, escHook string
	b := config.New(fs)
	bindStack(b, &f, "handoff-data", stack.DefaultCoordinatorAddr, stack.DefaultRunnerAddr, stack.DefaultWritebackAddr, "127.0.0.1:9464")
	b.String(&webAddr, "web-listen", "HANDOFF_WEB_LISTEN", "127.0.0.1:8080", "serve the operator page (escalations) at http://ADDR/ (empty: off)")
	b.String(&opToken, "operator-token", "HANDOFF_OPERATOR_TOKEN", "", fmt.Sprintf("operator token (%d bytes or more) for ListEscalations, ResolveEscalation, reading jobs with grpcurl and the operator page's sign-in (empty: one is made for this run and printed)", identity.MinOperatorTokenLen))
	b.String(&escHook, "escalation-webhook", "HANDOFF_ESCALATION_WEBHOOK", "", "POST each escalation (run, job, cause, a link to its page; Idempotency-Key run:escalation; retried) to this URL, for pipelines naming no escalation.webhook")
	b.String(&pipelines, "pipelines", "HANDOFF_PIPELINES", "", "folder of pipeline YAML files to run instead of the shipped ones (a stage may name its runner: e.g. the TypeScript one)")
	b.String(&operators, "operators", "HANDOFF_OPERATORS", "", identity.AccountsHelp+"; beside the operator token's account \"operator\"")
	b.String(&operatorsFile, "operators-file", "HANDOFF_OPERATORS_FILE", "", "file of operator accounts, in the format of --operators")
	if err := b.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(stderr, "handoff up:", err)
		return 2
	}
	for name, v := range map[string]string{flagTestRunnerVia: runnerVia, flagTestWritebackVia: wbVia} {
		if v == "" {
			continue
		}
		if err := testViaAddr(name, v); err != nil {
			fmt.Fprintln(stderr, "handoff up:", err)
			return 2
		}
	}
	accs, err := identity.LoadAccounts(operatorsFile, operators)
	if err != nil {
		fmt.Fprintln(stderr, "handoff up: --operators:", err)
		return 2
	}
	cfg := f.config(stderr)
	if pipelines != "" {
		if cfg.Pipelines, err = pipeline.LoadDir(pipelines); err != nil {
			fmt.Fprintln(stderr, "handoff up: --pipelines:", err)
			return 2
		}
	}
	generated := false
	if opToken == "" {
		// Fail closed: the page and ResolveEscalation can approve writes, so they never run
		// without a token. One is made for this run and printed; set HANDOFF_OPERATOR_TOKEN
		// to choose it.
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			fmt.Fprintln(stderr, "handoff up: operator token:", err)
			return 1
		}
		opToken, generated = hex.EncodeToString(b), true
	}
	cfg.WebAddr, cfg.OperatorToken, cfg.Operators, cfg.EscalationWebhook = webAddr, opToken, accs, escHook
	cfg.RunnerDial, cfg.WritebackDial = runnerVia, wbVia
	st, err := stack.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "handoff up:", err)
		return 1
	}
	fmt.Fprintf(stdout, "handoff up: data in %s\n  coordinator   %s\n  agent runner  %s\n  writeback     %s\n",
		f.data, st.CoordinatorAddr, st.RunnerAddr, st.WritebackAddr)
	if st.WebAddr != "" {
		fmt.Fprintf(stdout, "  operator page http://%s/ (operator token required)\n", st.WebAddr)
	}
	if generated {
		fmt.Fprintf(stdout, "  operator token %s (made for this run; set HANDOFF_OPERATOR_TOKEN to choose one)\n", opToken)
		fmt.Fprintf(stdout, "  for grpcurl: TOKEN=%s, then -H \"authorization: Bearer $TOKEN\"\n", opToken)
	}
	if f.metrics != "" {
		m, err := server.ServeMetrics("metrics-listen", f.metrics, st.Registry, cfg.Logger)
		if err != nil {
			st.Close()
			fmt.Fprintln(stderr, "handoff up:", err)
			return 1
		}
		defer m.Close()
		fmt.Fprintf(stdout, "  metrics       %s\n", m.URL())
	}
	fmt.Fprintf(stdout, "try: grpcurl -plaintext %s list\nCtrl-C drains in-flight calls and stops.\n", st.CoordinatorAddr)
	<-ctx.Done()
	fmt.Fprintln(stdout, "handoff up: stopping")
	st.Close()
	return 0
}

// The test-only flags of `handoff up` (see up): not in its --help.
const (
	flagTestRunnerVia    = "test-agentrunner-via"
	flagTestWritebackVia = "test-writeback-via"
)

var testOnlyUpFlags = []string{flagTestRunnerVia, flagTestWritebackVia}

// testViaAllowed: the test-only flags work only in a build with -tags crashpoints (the
// one `handoff chaos` makes), and in this package's tests; a release build refuses them.
var testViaAllowed = crashpoint.Enabled

// testViaAddr checks a test-only -via address: the coordinator sends its calls there in
// plaintext, with its signed service tokens (bearer tokens good for minutes at the agent
// runner and the writeback) and the packages, so only a loopback address (a test's proxy
// on this machine) with a port that can be dialed is taken.
func testViaAddr(name, v string) error {
	if !testViaAllowed {
		return fmt.Errorf("--%s: a test-only flag, only in a build with -tags crashpoints (as handoff chaos builds it)", name)
	}
	if err := config.HostPort(name, v); err != nil {
		return err
	}
	if _, port, _ := net.SplitHostPort(v); port == "0" {
		return fmt.Errorf("--%s %q: port 0 cannot be dialed", name, v)
	}
	if !rpc.IsLoopback(v) {
		return fmt.Errorf("--%s %q: want a loopback address (127.0.0.1, [::1] or localhost): the coordinator's calls and tokens go there in plaintext", name, v)
	}
	return nil
}

// printDefaultsExcept is fs.PrintDefaults without the flags named in hidden.
func printDefaultsExcept(fs *flag.FlagSet, w io.Writer, hidden []string) {
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(w)
	fs.VisitAll(func(f *flag.Flag) {
		if slices.Contains(hidden, f.Name) {
			return
		}
		shown.Var(f.Value, f.Name, f.Usage)
		shown.Lookup(f.Name).DefValue = f.DefValue
	})
	shown.PrintDefaults()
}
