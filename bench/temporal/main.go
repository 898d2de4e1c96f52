// Command temporal is the peer comparison of issue 6: the same 5-stage relay of no-op
// activities as a Temporal workflow, run side by side with handoff's job figure J
// (bench.RunJobs) in one process, interleaved in rounds.
//
// It is its own Go module so that the Temporal SDK never enters the main module's
// dependencies or its `go test ./...`. Run it from this folder:
//
//	cd bench/temporal && go run . [--jobs 96] [--serial 15] [--concurrency 32] [--rounds 3] [--temporal PATH] [--redis off] [--json]
//
// It starts `temporal server start-dev` (in memory, tuned as /work/shared/ANCHORS.md says:
// the stock dev server waits ~50 ms at every task hand-off) as a subprocess on free
// loopback ports, runs a worker in this process with 16 workflow and 16 activity pollers,
// and kills the dev server at the end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/handoffhq/handoff/internal/bench"
	"github.com/handoffhq/handoff/internal/bench/peer"
	"github.com/handoffhq/handoff/internal/gctune"
)

const (
	taskQueue = "bench-noop-5"
	stages    = 5
)

// NoopActivity is one stage: it does nothing.
func NoopActivity(ctx context.Context, stage int) error { return nil }

// RelayWorkflow runs the five no-op stages one after another, like handoff's bench-noop-5.
func RelayWorkflow(ctx workflow.Context) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 30 * time.Second})
	for i := range stages {
		if err := workflow.ExecuteActivity(ctx, NoopActivity, i+1).Get(ctx, nil); err != nil {
			return err
		}
	}
	return nil
}

type options struct {
	jobs, serial, conc, rounds int
	temporalBin, redis         string
	jsonOut                    bool
}

// ratio compares a handoff figure with Temporal's: handoff's jobs/s over Temporal's, and
// Temporal's p50 over handoff's (both "how many times better").
type ratio struct {
	Handoff         string  `json:"handoff"`
	ThroughputRatio float64 `json:"handoff_jobs_per_sec_over_temporal"`
	LatencyRatio    float64 `json:"temporal_p50_over_handoff_p50"`
	// Issue 6's targets (50 × the jobs/s, under 1/50 of the p50), kept for history: that
	// issue ended blocked, and issue 22 restated them.
	ThroughputMet bool `json:"target_throughput_50x_met"`
	LatencyMet    bool `json:"target_p50_under_1_50th_met"`
	// The same two ratios in each round alone: the rounds interleave, so round i of each
	// figure ran together.
	ThroughputRounds []float64 `json:"rounds_jobs_per_sec_ratio,omitempty"`
	LatencyRounds    []float64 `json:"rounds_p50_ratio,omitempty"`
	// Issue 22's target, on J_redis only: its jobs/s >= 30 × tuned Temporal's, measured here
	// in the same run (and how many rounds alone met it).
	Issue22Target    float64 `json:"issue22_throughput_target,omitempty"`
	Issue22Met       *bool   `json:"issue22_throughput_met,omitempty"`
	Issue22RoundsMet *int    `json:"issue22_throughput_rounds_met,omitempty"`
	// The most jobs/s the handoff figure could reach here at its own CPU per job with every
	// CPU busy (peer.CPUCeiling), and that over Temporal's jobs/s: a target above the latter
	// is out of reach until the figure's CPU per job falls.
	CPUCeiling             float64 `json:"handoff_cpu_ceiling_jobs_per_sec,omitempty"`
	CPUCeilingOverTemporal float64 `json:"handoff_cpu_ceiling_over_temporal,omitempty"`
}

// issue22Target is issue 22's J_redis target: >= 30 × tuned Temporal's jobs/s.
const issue22Target = 30

// jRedisKey is the Key of the figure issue 22's target is judged on.
const jRedisKey = "J_redis"

// ratios compares each handoff figure with Temporal's. A ratio over a figure with no jobs/s
// or no p50 is left 0 (never NaN or Inf, which JSON cannot carry) and meets nothing. ncpu
// is the machine's CPUs, for a figure's CPU ceiling (when its CPU per job was measured).
func ratios(temporal *peer.Figure, handoff []*peer.Figure, ncpu int) []ratio {
	var out []ratio
	for _, f := range handoff {
		r := ratio{Handoff: f.Name,
			ThroughputRounds: peer.RoundRatios(f.RoundsJPS, temporal.RoundsJPS),
			LatencyRounds:    peer.RoundRatios(temporal.RoundsP50, f.RoundsP50)}
		r.ThroughputRatio = peer.Over(f.JobsPerSec, temporal.JobsPerSec)
		r.LatencyRatio = peer.Over(temporal.P50ms, f.P50ms)
		r.ThroughputMet, r.LatencyMet = r.ThroughputRatio >= 50, r.LatencyRatio > 50
		r.CPUCeiling, r.CPUCeilingOverTemporal = peer.Ceiling(ncpu, f, temporal)
		if f.Key == jRedisKey {
			r.Issue22Target = issue22Target
			r.Issue22Met, r.Issue22RoundsMet = peer.Judge(r.ThroughputRatio, r.ThroughputRounds, func(v float64) bool { return v >= issue22Target })
		}
		out = append(out, r)
	}
	return out
}

type report struct {
	peer.Header
	TemporalCLI string         `json:"temporal_cli"`
	Figures     []*peer.Figure `json:"figures"`
	Ratios      []ratio        `json:"ratios"`
	Notes       []string       `json:"notes,omitempty"`
	// Settle is how long each measured phase waited for the dev server and this process
	// to go quiet.
	Settle peer.SettleLog `json:"peer_settle"`
}

func main() {
	// handoff's side runs with the GC policy its binaries ship with (the peer's worker in
	// this process gets it too).
	if _, err := gctune.Apply(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var o options
	flag.IntVar(&o.jobs, "jobs", 96, "jobs per round with --concurrency in flight (jobs/s)")
	flag.IntVar(&o.serial, "serial", 15, "jobs per round one at a time (p50)")
	flag.IntVar(&o.conc, "concurrency", 32, "jobs in flight for jobs/s")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds (each figure runs once per round and mode)")
	flag.StringVar(&o.temporalBin, "temporal", "", "temporal CLI binary (default: ../../bin/temporal, then $PATH)")
	flag.StringVar(&o.redis, "redis", bench.DefaultRedisAddr, `Redis for handoff J_redis ("off" to skip)`)
	flag.BoolVar(&o.jsonOut, "json", false, "print the report as JSON")
	flag.Parse()
	if o.jobs <= 0 || o.serial <= 0 || o.conc <= 0 || o.rounds <= 0 {
		fmt.Fprintln(os.Stderr, "temporal: --jobs, --serial, --concurrency and --rounds must be positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "temporal:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	bin, err := findTemporal(o.temporalBin)
	if err != nil {
		return err
	}
	rep := &report{Header: peer.NewHeader(o.jobs, o.serial, o.conc, o.rounds), Settle: peer.NewSettleLog(peer.DefaultQuiet)}
	if out, err := exec.CommandContext(ctx, bin, "--version").Output(); err == nil {
		rep.TemporalCLI = string(trimNL(out))
	}

	srv, hostPort, err := startDevServer(ctx, bin)
	if err != nil {
		return err
	}
	defer srv.stop()
	log := tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	c, err := dialWhenReady(ctx, hostPort, log, srv)
	if err != nil {
		return err
	}
	defer c.Close()
	w := worker.New(c, taskQueue, worker.Options{
		MaxConcurrentWorkflowTaskPollers: 16,
		MaxConcurrentActivityTaskPollers: 16,
	})
	w.RegisterWorkflow(RelayWorkflow)
	w.RegisterActivityWithOptions(NoopActivity, activity.RegisterOptions{Name: "NoopActivity"})
	if err := w.Start(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer w.Stop()

	var seq atomic.Int64
	tJob := func(ctx context.Context) error {
		id := "bench-" + strconv.FormatInt(seq.Add(1), 10)
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: taskQueue}, RelayWorkflow)
		if err != nil {
			return err
		}
		return run.Get(ctx, nil)
	}
	// warm-up: the task queue, the worker's pollers, the namespace cache.
	for range 3 {
		if err := tJob(ctx); err != nil {
			return fmt.Errorf("temporal warm-up job: %w", err)
		}
	}

	stores := []string{"bolt"}
	if o.redis != "off" {
		if err := bench.RedisReachable(ctx, o.redis); err != nil {
			rep.Notes = append(rep.Notes, "J_redis skipped: "+err.Error())
		} else {
			stores = append(stores, "redis")
		}
	}
	temporal := &peer.Figure{Key: "temporal", Name: "Temporal (dev server, in memory, tuned)"}
	handoff := map[string]*peer.Figure{}
	for _, s := range stores {
		handoff[s] = &peer.Figure{Key: "J_" + s, Name: "handoff J_" + s}
	}
	progress := func(format string, args ...any) {
		if !o.jsonOut {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}
	// Every measured phase, Temporal's and handoff's, starts with the dev server and this
	// process (handoff's services, the worker) quiet.
	settle := rep.Settle.Waiter(ctx, srv.cmd.Process.Pid, "the Temporal dev server", srv.stderr)
	var tP50, tP99 time.Duration
	for r := range o.rounds {
		// one at a time: p50
		if err := settle(); err != nil {
			return err
		}
		lat, _, err := bench.RunN(ctx, o.serial, 1, func(ctx context.Context, _ int) error { return tJob(ctx) })
		if err != nil {
			return fmt.Errorf("temporal serial: %w", err)
		}
		tP50, tP99 = bench.Quantiles(lat)
		progress("round %d: temporal serial p50 %v", r+1, tP50)
		hs := map[string]bench.JobsResult{}
		for _, s := range stores {
			if err := settle(); err != nil {
				return err
			}
			res, err := bench.RunJobs(ctx, bench.JobsConfig{N: o.serial, Concurrency: 1, Store: s, RedisAddr: o.redis})
			if err != nil {
				return fmt.Errorf("handoff J_%s serial: %w", s, err)
			}
			hs[s] = res
			progress("round %d: handoff J_%s serial p50 %v", r+1, s, res.P50)
		}
		// conc in flight: jobs/s
		if err := settle(); err != nil {
			return err
		}
		_, el, err := bench.RunN(ctx, o.jobs, o.conc, func(ctx context.Context, _ int) error { return tJob(ctx) })
		if err != nil {
			return fmt.Errorf("temporal concurrent: %w", err)
		}
		tJPS := float64(o.jobs) / el.Seconds()
		temporal.Add(tP50, tP99, tJPS)
		progress("round %d: temporal %.1f jobs/s", r+1, tJPS)
		for _, s := range stores {
			if err := settle(); err != nil {
				return err
			}
			res, err := bench.RunJobs(ctx, bench.JobsConfig{N: o.jobs, Concurrency: o.conc, Store: s, RedisAddr: o.redis})
			if err != nil {
				return fmt.Errorf("handoff J_%s concurrent: %w", s, err)
			}
			handoff[s].Add(hs[s].P50, hs[s].P99, res.JobsPerSec)
			handoff[s].AddCPU(res.CPU)
			progress("round %d: handoff J_%s %.1f jobs/s, %v CPU per job", r+1, s, res.JobsPerSec, res.CPU.Round(time.Microsecond))
		}
	}
	temporal.Finish()
	rep.Figures = append(rep.Figures, temporal)
	var hs []*peer.Figure
	for _, s := range stores {
		f := handoff[s]
		f.Finish()
		hs = append(hs, f)
	}
	rep.Figures = append(rep.Figures, hs...)
	rep.Ratios = ratios(temporal, hs, rep.NumCPU)
	rep.Notes = append(rep.Notes, "handoff's CPU per job: this process's (its services and client; the Temporal worker idles meanwhile) plus, for J_redis, the Redis server's, over the jobs in flight",
		rep.Settle.Describe("the Temporal dev server and this process"))
	rep.LoadEnd = peer.Loadavg()

	if o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReport(rep)
	return nil
}

func printReport(rep *report) {
	fmt.Printf("peer comparison: 5 sequential no-op stages per job; %s, %d CPUs, %s, load %s -> %s\n",
		rep.Date, rep.NumCPU, rep.GoVersion, rep.Load, rep.LoadEnd)
	fmt.Printf("temporal CLI: %s\n", rep.TemporalCLI)
	fmt.Printf("%d rounds; per round %d jobs one at a time (p50, p99) and %d jobs with %d in flight (jobs/s); medians over rounds\n\n",
		rep.Rounds, rep.Serial, rep.Jobs, rep.Concurrency)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tp50 ms\tp99 ms\tjobs/s\tCPU ms/job\tp50 per round\tjobs/s per round")
	for _, f := range rep.Figures {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%s\t%v\t%v\n", f.Name, f.P50ms, f.P99ms, f.JobsPerSec, f.CPUCell(), peer.Round1(f.RoundsP50), peer.Round1(f.RoundsJPS))
	}
	tw.Flush()
	fmt.Println()
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ratio\thandoff jobs/s ÷ Temporal jobs/s (issue 6: >= 50)\tTemporal p50 ÷ handoff p50 (issue 6: > 50)\tjobs/s ratio per round")
	for _, r := range rep.Ratios {
		fmt.Fprintf(tw, "%s\t%.2f (%s)\t%.2f (%s)\t%v\n", r.Handoff, r.ThroughputRatio, met(r.ThroughputMet), r.LatencyRatio, met(r.LatencyMet), r.ThroughputRounds)
	}
	tw.Flush()
	for _, r := range rep.Ratios {
		if r.Issue22Met == nil {
			continue
		}
		fmt.Printf("issue 22: %s >= %g × Temporal's jobs/s: %.2f (%s)", r.Handoff, r.Issue22Target, r.ThroughputRatio, met(*r.Issue22Met))
		if r.Issue22RoundsMet != nil {
			fmt.Printf(" (rounds alone: %d of %d met it)", *r.Issue22RoundsMet, len(r.ThroughputRounds))
		}
		fmt.Println()
		if r.CPUCeiling > 0 {
			fmt.Printf("ceiling: at its CPU per job, every CPU busy, %s reaches at most %.0f jobs/s, %.2f × Temporal's\n", r.Handoff, r.CPUCeiling, r.CPUCeilingOverTemporal)
		}
	}
	for _, n := range rep.Notes {
		fmt.Println("note:", n)
	}
}

func met(b bool) string {
	if b {
		return "met"
	}
	return "missed"
}

// devServer is the `temporal server start-dev` subprocess, in its own process group.
type devServer struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stderr *peer.Tail
	once   sync.Once
}

func startDevServer(ctx context.Context, bin string) (*devServer, string, error) {
	port, err := peer.FreePort()
	if err != nil {
		return nil, "", err
	}
	args := []string{"server", "start-dev", "--headless", "--ip", "127.0.0.1",
		"--port", strconv.Itoa(port), // HTTP API and /metrics: random free ports (the CLI's default)
		"--log-level", "error",
		"--dynamic-config-value", "history.transferProcessorMaxPollRPS=100000",
		"--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
		"--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t := &peer.Tail{}
	cmd.Stdout, cmd.Stderr = t, t
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", bin, err)
	}
	s := &devServer{cmd: cmd, done: make(chan struct{}), stderr: t}
	go func() { cmd.Wait(); close(s.done) }()
	return s, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// stop ends the dev server's process group: SIGTERM, then SIGKILL after 5 s.
func (s *devServer) stop() {
	s.once.Do(func() {
		pgid := s.cmd.Process.Pid
		syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-s.done
		}
	})
}

func dialWhenReady(ctx context.Context, hostPort string, log tlog.Logger, s *devServer) (client.Client, error) {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return nil, fmt.Errorf("temporal dev server exited: %s", s.stderr.String())
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := client.DialContext(dctx, client.Options{HostPort: hostPort, Namespace: "default", Logger: log})
		if err == nil {
			_, err = c.WorkflowService().DescribeNamespace(dctx, &workflowservice.DescribeNamespaceRequest{Namespace: "default"})
			if err == nil {
				cancel()
				return c, nil
			}
			c.Close()
		}
		cancel()
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return nil, fmt.Errorf("temporal dev server at %s not ready after 60 s: %v; output: %s", hostPort, last, s.stderr.String())
}

func findTemporal(flagPath string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	for _, p := range []string{"../../bin/temporal", "bin/temporal"} {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return filepath.Abs(p)
		}
	}
	if p, err := exec.LookPath("temporal"); err == nil {
		return p, nil
	}
	return "", errors.New("no temporal CLI: GOBIN=$PWD/bin go install github.com/temporalio/cli/cmd/temporal@v1.5.1 (from the repository root), or pass --temporal PATH")
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
