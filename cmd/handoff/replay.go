package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/bench"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store"
)

var replayHelp = about("replay") + `Usage: handoff replay [flags]

Generates --n handoff packages (valid ones for distinct jobs; --invalid of them broken in
varied ways: missing job_id, goal, budget or an artifact uri, version handoff.v9, a bad or
all-zero traceparent, an empty wallet (no money, no hops); --duplicate of them re-deliveries
of earlier valid ones) and sends them to the agent runner's Deliver as the coordinator,
--concurrency at a time. Every valid package that completes is then written through the
writeback (with a judge's PASS), and every duplicate repeats its write. It prints what every
kind got against what it must get, agent calls for rejected packages, ledger entries and
double writes, trace breaks, the elapsed time and the hop latency.

Without --runner, the platform runs in-process (stack.Start on the embedded store, with a
counting Noop agent for --stage). With --runner ADDR (--coordinator ADDR is the same: the
address the replay sends hops to as the coordinator), it dials the deployment:
  identity  --certs DIR (mTLS with the "coordinator" certificate of ` + "`handoff certs`" + `), or
            --plaintext-loopback --token-key-file DIR/coordinator.key (the coordinator's
            own key from ` + "`handoff keys`" + `)
  stage     the runner must serve --stage with an agent that completes any package, e.g.
            agentrunner --exec 'replay=/path/to/noop.sh' (a script: cat >/dev/null; echo '{}')
  writes    --writeback ADDR; the artifact to write is the result's, or one stored in
            --artifacts DIR (the deployment's artifact folder) when the result has none
  counts    --metrics URL (the runner's /metrics) for agent calls, --ledger-store redis://...
            for ledger entries and the writes offered per key (the ledger upserts by key and
            counts each offer); without them those figures are "unknown" (double writes are
            then judged from the receipts)

Exits 0 when every package got its expected status and agent calls for rejected packages,
double writes and trace breaks are all zero; 1 otherwise; 2 on usage errors.

Flags:`

type replayFlags struct {
	n, concurrency                            int
	invalid, duplicate                        float64
	seed                                      int64
	jsonOut, verbose                          bool
	stage, runner, writeback, metrics, ledger string
	artifacts, data                           string
	sec                                       rpc.Security
}

func runReplay(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("handoff replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, replayHelp)
		fs.PrintDefaults()
	}
	var f replayFlags
	fs.IntVar(&f.n, "n", 1000, "packages to send")
	fs.Float64Var(&f.invalid, "invalid", 0.10, "fraction of invalid packages")
	fs.Float64Var(&f.duplicate, "duplicate", 0.05, "fraction of re-delivered duplicates of earlier valid packages")
	fs.Int64Var(&f.seed, "seed", 1, "seed of the kinds, their order and the traces")
	fs.IntVar(&f.concurrency, "concurrency", 32, "hops in flight")
	fs.BoolVar(&f.jsonOut, "json", false, "print the summary as JSON")
	fs.BoolVar(&f.verbose, "v", false, "log the in-process services' warnings on stderr")
	fs.StringVar(&f.stage, "stage", "replay", "stage the packages are addressed to")
	fs.StringVar(&f.runner, "runner", "", "agent runner address of a running deployment (default: start one in-process)")
	fs.StringVar(&f.runner, "coordinator", "", "same as --runner")
	fs.StringVar(&f.writeback, "writeback", "", "writeback address of the deployment (with --runner; without it no writes are made)")
	fs.StringVar(&f.metrics, "metrics", "", "the runner's Prometheus URL (http://host:port/metrics), to count agent calls (with --runner)")
	fs.StringVar(&f.ledger, "ledger-store", "", "the deployment's redis:// store, to count ledger entries (with --runner)")
	fs.StringVar(&f.artifacts, "artifacts", "", "the deployment's artifact folder, for writes whose result carries no artifact (with --runner)")
	fs.StringVar(&f.data, "data", "", "in-process: folder of the embedded store (default: a temporary folder); on tmpfs the summary says it is not durable")
	f.sec.Bind(config.New(fs))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || f.n <= 0 || f.concurrency <= 0 {
		fmt.Fprintln(stderr, "handoff replay: --n and --concurrency must be positive, and no arguments are taken")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	cfg := bench.ReplayConfig{N: f.n, Invalid: f.invalid, Duplicate: f.duplicate, Seed: f.seed, Concurrency: f.concurrency, Stage: f.stage}
	target, storeNote := "", ""
	if f.runner == "" {
		level := slog.LevelError
		if f.verbose {
			level = slog.LevelWarn
		}
		rs, err := bench.StartReplayStack(ctx, f.data, f.stage, slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})))
		if err != nil {
			fmt.Fprintln(stderr, "handoff replay:", err)
			return 1
		}
		defer rs.Close()
		cfg.Runner, cfg.Writeback, cfg.Agent, cfg.Ledger = rs.Runner, rs.Writeback, rs.Agent, rs.Stack.Store
		target, storeNote = "in-process stack (agent runner "+rs.Stack.RunnerAddr+")", rs.StoreNote
	} else {
		dc, err := f.sec.Client("coordinator")
		if err != nil {
			fmt.Fprintln(stderr, "handoff replay:", err)
			return 2
		}
		rc, err := rpc.Dial(f.runner, dc)
		if err != nil {
			fmt.Fprintln(stderr, "handoff replay:", err)
			return 1
		}
		defer rc.Close()
		cfg.Runner = handoffv1.NewAgentRunnerServiceClient(rc)
		target = "agent runner " + f.runner
		if f.writeback != "" {
			wc, err := rpc.Dial(f.writeback, dc)
			if err != nil {
				fmt.Fprintln(stderr, "handoff replay:", err)
				return 1
			}
			defer wc.Close()
			cfg.Writeback = handoffv1.NewWritebackServiceClient(wc)
			target += ", writeback " + f.writeback
		}
		if f.artifacts != "" {
			a, err := artifact.NewFiles(f.artifacts)
			if err != nil {
				fmt.Fprintln(stderr, "handoff replay: --artifacts:", err)
				return 2
			}
			cfg.Artifacts = a
		}
		if f.metrics != "" {
			url := f.metrics
			cfg.AcceptedCounter = func(ctx context.Context) (float64, error) { return acceptedDelivers(ctx, url) }
		}
		if f.ledger != "" {
			if o, err := store.ParseURL(f.ledger); err != nil || o == nil {
				fmt.Fprintln(stderr, "handoff replay: --ledger-store must be the deployment's redis:// store (a bbolt file is locked by the service that has it open)")
				return 2
			}
			st, err := store.OpenURL(ctx, f.ledger)
			if err != nil {
				fmt.Fprintln(stderr, "handoff replay: --ledger-store:", err)
				return 1
			}
			defer st.Close()
			cfg.Ledger = st
		}
	}

	stopBar := progressBar(stderr, f.n, &cfg)
	rep, err := bench.Replay(ctx, cfg)
	stopBar()
	if err != nil {
		fmt.Fprintln(stderr, "handoff replay:", err)
		return 1
	}
	rep.Target, rep.Store = target, storeNote
	if f.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printReplay(stdout, rep, f)
	}
	if !rep.OK {
		return 1
	}
	return 0
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	fh, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := fh.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar draws a bar on stderr while the replay runs, only when stderr is a terminal;
// the returned func stops and erases it.
func progressBar(stderr io.Writer, total int, cfg *bench.ReplayConfig) func() {
	if !isTerminal(stderr) {
		return func() {}
	}
	var done atomic.Int64
	cfg.Progress = func(n int) { done.Store(int64(n)) }
	quit, finished := make(chan struct{}), make(chan struct{})
	draw := func() {
		n := int(done.Load())
		const width = 40
		fill := n * width / total
		fmt.Fprintf(stderr, "\r  replay [%s%s] %d/%d", strings.Repeat("#", fill), strings.Repeat(".", width-fill), n, total)
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				fmt.Fprint(stderr, "\r\033[K")
				return
			case <-t.C:
				draw()
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// acceptedDelivers reads handoff_acks_total{service="agentrunner",grpc_method="Deliver",
// status="ACCEPTED"} from a Prometheus text endpoint (0 while the series does not exist).
func acceptedDelivers(ctx context.Context, url string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "handoff_acks_total{") || !strings.Contains(line, `grpc_method="Deliver"`) ||
			!strings.Contains(line, `status="ACCEPTED"`) || !strings.Contains(line, `service="agentrunner"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", url, line, err)
		}
		sum += v
	}
	// No series yet is 0: the counter appears with the runner's first ACCEPTED Deliver ack.
	return sum, sc.Err()
}

func printReplay(w io.Writer, rep *bench.ReplayReport, f replayFlags) {
	counts := map[bench.Kind]int{}
	for _, k := range rep.Kinds {
		counts[k.Kind] += k.Sent
	}
	invalid := rep.Sent - counts[bench.KindValid] - counts[bench.KindDuplicate]
	fmt.Fprintf(w, "handoff replay: %d packages (%d valid, %d invalid, %d duplicates), seed %d, %d in flight\n",
		rep.Sent, counts[bench.KindValid], invalid, counts[bench.KindDuplicate], rep.Seed, f.concurrency)
	fmt.Fprintf(w, "target: %s\n", rep.Target)
	if rep.Store != "" {
		fmt.Fprintf(w, "store:  %s\n", rep.Store)
	}
	fmt.Fprintf(w, "\n%-22s %5s  %-16s %s\n", "kind", "sent", "expected", "got")
	for _, k := range rep.Kinds {
		var got []string
		for s, n := range k.Got {
			got = append(got, fmt.Sprintf("%s %d", s, n))
		}
		mark := ""
		if k.Wrong > 0 {
			mark = fmt.Sprintf("   <- %d WRONG", k.Wrong)
		}
		fmt.Fprintf(w, "%-22s %5d  %-16s %s%s\n", k.Kind, k.Sent, k.Expected, strings.Join(got, ", "), mark)
	}
	for _, s := range rep.WrongSamples {
		fmt.Fprintln(w, "  wrong:", s)
	}
	fmt.Fprintf(w, "\nagent calls:           %v in total, %v for rejected or duplicate packages (%s)\n", rep.AgentCalls, rep.AgentCallsForRejected, rep.AgentCallsBy)
	wr := rep.Writes
	fmt.Fprintf(w, "external writes:       %d sent (%d first receipts, %d duplicate receipts, %d skipped, %d failed); ledger %v entries for %v keys\n",
		wr.Sent, wr.Receipts, wr.DuplicateReceipts, wr.Skipped, wr.Errors, wr.LedgerEntries, wr.LedgerKeys)
	fmt.Fprintf(w, "double writes:         %d (%s)\n", wr.DoubleWrites, wr.DoubleWritesBy)
	fmt.Fprintf(w, "trace breaks:          %d\n", rep.TraceBreaks)
	for _, s := range rep.TraceBreakSamples {
		fmt.Fprintln(w, "  break:", s)
	}
	fmt.Fprintf(w, "elapsed:               %.0f ms (%.0f hops/s); hop latency p50 %.0f µs, p99 %.0f µs\n", rep.ElapsedMS, rep.HopsPerSec, rep.HopP50us, rep.HopP99us)
	if rep.OK {
		fmt.Fprintln(w, "\nOK: every package got its expected status; no agent call for a rejected package, no double write, no trace break")
	} else {
		fmt.Fprintln(w, "\nFAILED:")
		for _, s := range rep.Failures {
			fmt.Fprintln(w, "  -", s)
		}
	}
}
