package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
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
Redis INFO cpu, per operation of A, A2 and B's throughput bursts; per job of J_redis's and,
process only, J_bolt's), B/A, C/A and R/echo, against the issue's targets.
Figures needing Redis are reported skipped (with the reason) when it does not answer.
--only A2,B measures just the figures named (A2 also starts B's rig and R_floor's server,
A echo's server, which they need); the ratios and targets of the others are reported skipped.
Exits 1 when a figure fails to run (missed targets do not fail it).

With --shards N it measures instead J on one Redis (its own redis-server, or --redis)
beside J on a Redis Cluster
(--cluster nodes, or a local one of 3 masters and 3 replicas it starts), N jobs each, and
the Redis server CPU per job from INFO cpu deltas (summed over the cluster's masters),
with the shards a job rate needs at 70% of a master's core.

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
	only := fs.String("only", "", "measure only these figures, comma-separated (e.g. A2,B); the others are reported skipped")
	shards := fs.Int("shards", 0, "measure J on one Redis beside J on a Redis Cluster, this many jobs each (0: the usual figures)")
	clusterAddrs := fs.String("cluster", "", "with --shards: host:port,... of a Redis Cluster (default: start a local one)")
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
	if *shards < 0 {
		fmt.Fprintf(stderr, "handoff bench: --shards must not be negative, got %d\n", *shards)
		return 2
	}
	if *clusterAddrs != "" && *shards == 0 {
		fmt.Fprintln(stderr, "handoff bench: --cluster needs --shards")
		return 2
	}
	onlySet := false // --only= names no figure: an error, not the full suite
	fs.Visit(func(f *flag.Flag) { onlySet = onlySet || f.Name == "only" })
	if onlySet {
		if *shards > 0 {
			fmt.Fprintln(stderr, "handoff bench: --only does not apply to --shards")
			return 2
		}
		cfg.Only = strings.Split(*only, ",")
		for i := range cfg.Only {
			cfg.Only[i] = strings.TrimSpace(cfg.Only[i])
		}
		if err := bench.CheckOnly(cfg.Only, cfg.TmpfsBolt); err != nil {
			fmt.Fprintln(stderr, "handoff", err)
			return 2
		}
	}
	if isTerminal(stderr) {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *shards > 0 {
		redisSet := false // --shards starts a redis-server of its own unless --redis names one
		fs.Visit(func(f *flag.Flag) { redisSet = redisSet || f.Name == "redis" })
		return runShards(ctx, *shards, cfg, redisSet, *clusterAddrs, jsonOut, stdout, stderr)
	}
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

// runShards is `handoff bench --shards N`.
func runShards(ctx context.Context, n int, cfg bench.Config, redisSet bool, cluster string, jsonOut bool, stdout, stderr io.Writer) int {
	sc := bench.ShardsConfig{Jobs: n, Concurrency: cfg.Concurrency}
	if redisSet {
		sc.RedisAddr = cfg.RedisAddr
	}
	if cfg.JobsConcurrency > 0 {
		sc.Concurrency = cfg.JobsConcurrency
	}
	if cluster != "" {
		sc.ClusterAddrs = strings.Split(cluster, ",")
	}
	res, err := bench.RunShards(ctx, sc)
	if err != nil {
		fmt.Fprintln(stderr, "handoff bench:", err)
		return 1
	}
	if jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(res)
		return 0
	}
	fmt.Fprintf(stdout, "J: %d five-stage Noop jobs per side, %d in flight\n", n, sc.Concurrency)
	fmt.Fprintf(stdout, "%-16s %8s %10s %10s %8s %14s %14s\n", "store", "masters", "jobs/s", "p50", "p99", "redis cpu/job", "jobs/s/shard")
	for _, s := range []struct {
		name string
		side bench.ShardSide
	}{{"one redis", res.One}, {"redis cluster", res.Cluster}} {
		fmt.Fprintf(stdout, "%-16s %8d %10.1f %10s %8s %14s %14.0f\n", s.name, s.side.Masters, s.side.Jobs.JobsPerSec,
			s.side.Jobs.P50.Round(time.Microsecond), s.side.Jobs.P99.Round(time.Microsecond), s.side.CPUPerJob.Round(time.Microsecond), s.side.JobsPerShard)
	}
	fmt.Fprintln(stdout, "shards needed (each master at 70% of one core): ceil(rate x cpu/job / 0.7s)")
	for _, rate := range []float64{100, 1000, 10000} {
		fmt.Fprintf(stdout, "  %6.0f jobs/s: %d (at the cluster's %s/job)\n", rate, bench.ShardsFor(rate, res.Cluster), res.Cluster.CPUPerJob.Round(time.Microsecond))
	}
	return 0
}
