package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/handoffhq/handoff/internal/bench"
)

var benchHelp = about("bench") + `Usage: handoff bench [flags]

Measures, in this one process and interleaved in short round-robin bursts, what a hop costs
on the platform against the same hop without it:
  A        bare hop: gRPC unary, 1 KiB over 127.0.0.1, handler does one Redis SET NX
  A2       B's honest floor: the runner's Deliver on a plain gRPC server, the handler
           running the store's Admit (claim + debit, one Lua script), sending an ack and a
           result of B's shape, then its Complete; the client then one PutRun of B's run
  B        platform hop on Redis: ~2 KB package from a coordinator-identity client through
           the agent runner's full interceptor chain to a Noop agent, Ack + StageResult
           received, then one PutRun of the run (as the coordinator records a hop)
  C        the same on the embedded bbolt store (fsync per write transaction)
  R        a REJECTED_SCHEMA round trip (the agent must not run); echo: bare 1 KiB gRPC echo
  R_floor  R's floor: the bare Deliver stream returning one message, its handler running V
  V        contract validation of the ~2 KB package alone
  J_redis, J_bolt   5-stage Noop job through the coordinator, SubmitJob to COMPLETED
  J_routes J_redis with a declared route chosen and checked at every stage
  J_triage the shipped support-triage pipeline (routes, judge, one write) on bbolt
and the ratios B/A2 and R/R_floor (p50, throughput), CPU per hop (process getrusage +
Redis INFO cpu, per operation of A, A2 and B's throughput bursts), B/A, C/A and R/echo,
against the issue's targets.
Figures needing Redis are reported skipped (with the reason) when it does not answer.
Exits 1 when a figure fails to run (missed targets do not fail it).

Flags:`

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("handoff bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, benchHelp)
		fs.PrintDefaults()
	}
	var cfg bench.Config
	var jsonOut bool
	fs.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	fs.DurationVar(&cfg.Duration, "duration", 3*time.Second, "measuring time shared by all figures (J bursts drain their jobs in flight, so the wall time is longer)")
	fs.StringVar(&cfg.RedisAddr, "redis", bench.DefaultRedisAddr, `Redis for A, B and J_redis ("off" to skip them)`)
	fs.IntVar(&cfg.Concurrency, "concurrency", 32, "calls (or jobs) in flight in the throughput bursts")
	fs.IntVar(&cfg.JobsConcurrency, "jobs-concurrency", 0, "jobs in flight in J's throughput bursts (default --concurrency)")
	fs.StringVar(&cfg.BoltDir, "bolt-dir", "", "folder for the bbolt files (default: the OS temp folder)")
	fs.BoolVar(&cfg.TmpfsBolt, "tmpfs-bolt", false, "also measure C_tmpfs: C with bbolt on /dev/shm, where fsync does nothing (labelled NOT DURABLE)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || cfg.Duration <= 0 || cfg.Concurrency <= 0 {
		fmt.Fprintln(stderr, "handoff bench: --duration and --concurrency must be positive, and no arguments are taken")
		return 2
	}
	if isTerminal(stderr) {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		if jsonOut {
			rep.WriteJSON(stdout)
		} else {
			rep.WriteText(stdout)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "handoff bench:", err)
		return 1
	}
	return 0
}
