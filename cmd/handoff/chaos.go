package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/handoffhq/handoff/internal/chaos"
)

var chaosUsage = about("chaos") + `Usage: handoff chaos [--jobs 500] [--kills 10] [--redis-restarts 1] [--redeliver 0.05] [--target both] [--store redis] [--json] [flags]

Runs the platform as deployed (coordinator x2, agent runner and writeback as separate
processes built from this source tree, on a redis-server of its own; or, --store bbolt,
handoff up in one process, see below) and breaks it while support-ticket jobs run:
SIGKILLs the writeback in the middle of writes, a coordinator mid-job and the agent runner
mid-stage (--kills times each), restarts Redis (--redis-restarts), and delivers a share of
hops twice (--redeliver). Killed processes are restarted.

The jobs write to (--target) the writeback's ledger target, the demo ledger in the shared
Redis (on bbolt, in the file), which upserts by key and stores each entry with its receipt
in one transaction (the writeback is killed at its crash points: after the claim, inside
that transaction, after the write, after the receipt); or an HTTP sink behind the webhook
target, which records every write and honours Idempotency-Key (the writeback is killed
after the sink applied a write and before it answered); or both, every other job to each.

With --store bbolt the deployment is handoff up: the three services in one process on one
bbolt file (one file has one process), built from this source tree with -tags crashpoints
and run as one supervised process whose coordinator dials the hop proxy. Every kill
SIGKILLs that process (all three services) and starts it again on the same file; the
report's kinds (coordinator, agentrunner, writeback) say where the kill was made: mid-job,
mid-stage after ACCEPTED, at the writeback's crash points or after the sink applied. The
ledger is the one in the bbolt file. There is no Redis, so no Redis restarts, and the
timings are up's own (--lease-ttl does not apply). Opening the file releases the leases
and pending claims the killed process left, so the restarted one resumes at once.

With --store redis-cluster the services share a local Redis Cluster (3 masters, 3
replicas, each node append-only) instead of one redis-server, and each Redis fault
SIGKILLs a master: its replica is promoted, and the killed node is started again as a
replica. --wait makes the services' store WAIT for a replica's acknowledgement of each
claim, receipt and ledger write (redis-cluster://...?wait=1); without it an acknowledged
write can be lost with its master.

At the end it prints the jobs by state, the faults injected and what the ledger and the
sink saw, the time from each kill to the resume of the jobs it stalled (p50/p99 per kind
of kill; a job a later kill breaks again counts for that kill) and, on a cluster, each failover's duration. Must be 0: jobs lost (not terminal by --deadline), double writes (a job written
under a second key or without one), re-sent sink keys with another body, ledger keys
offered twice (on one Redis; on a cluster re-offers are counted), completed ledger jobs whose receipt names another entry, completed jobs
without a write; and every asked fault must have been injected.

Needs redis-server (apt-get install redis-server; not for --store bbolt) and, unless --bin
is given, the Go toolchain in the handoff source tree (it runs one go build, with -tags
crashpoints).

Flags:
  --jobs N             jobs to run (default 500)
  --kills N            SIGKILLs of each service (default 10; 0 for none)
  --redis-restarts N   redis-server restarts (default 1; 0 for none; none on bbolt)
  --redeliver F        share of hops delivered twice (default 0.05; 0 for none)
  --target T           where the jobs write: ledger, sink or both (default both)
  --concurrency N      jobs in flight at once (default 32)
  --deadline D         every job must be terminal within D of the first submission (default 15m)
  --lease-ttl D        the coordinators' run lease (default 1.5s; not on bbolt)
  --store S            redis (one redis-server), redis-cluster, or bbolt (handoff up in
                       one process) (default redis)
  --wait               on redis-cluster: WAIT for one replica before each claim,
                       receipt and ledger write returns
  --seed N             seed of the re-delivery choice (default random)
  --bin DIR            prebuilt coordinator, agentrunner and writeback binaries (the
                       writeback built with -tags crashpoints unless --target sink); on
                       bbolt a prebuilt handoff binary, built with -tags crashpoints
                       whatever the target (up's test-only flags need it)
  --redis-server PATH  redis-server binary (default: found on PATH)
  --dir DIR            work folder, kept (default: a temporary one, removed unless --keep
                       or the run failed)
  --keep               keep the temporary work folder
  --json               print the report as JSON
  --quiet              no progress lines on stderr

Exit status: 0 when nothing must-be-zero was violated, 1 when something was, 2 on a usage
error or when the harness could not run.
`

// runChaos implements `handoff chaos`.
func runChaos(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	var cfg chaos.Config
	fs.IntVar(&cfg.Jobs, "jobs", 500, "")
	kills := fs.Int("kills", 10, "")
	restarts := fs.Int("redis-restarts", 1, "")
	redeliver := fs.Float64("redeliver", 0.05, "")
	fs.IntVar(&cfg.Concurrency, "concurrency", 32, "")
	fs.DurationVar(&cfg.Deadline, "deadline", 15*time.Minute, "")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 1500*time.Millisecond, "")
	fs.StringVar(&cfg.Store, "store", chaos.StoreRedis, "")
	fs.BoolVar(&cfg.Wait, "wait", false, "")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "")
	fs.StringVar(&cfg.BinDir, "bin", "", "")
	fs.StringVar(&cfg.RedisServer, "redis-server", "", "")
	fs.StringVar(&cfg.Target, "target", chaos.TargetBoth, "")
	fs.StringVar(&cfg.WorkDir, "dir", "", "")
	fs.BoolVar(&cfg.Keep, "keep", false, "")
	asJSON := fs.Bool("json", false, "")
	quiet := fs.Bool("quiet", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, chaosUsage)
			return 0
		}
		fmt.Fprint(stderr, "\n"+chaosUsage)
		return 2
	}
	set := map[string]bool{} // the flags given
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "handoff chaos: unexpected argument %q\n\n%s", fs.Arg(0), chaosUsage)
		return 2
	}
	switch {
	case cfg.Jobs <= 0:
		fmt.Fprintf(stderr, "handoff chaos: --jobs must be positive, got %d\n", cfg.Jobs)
		return 2
	case *kills < 0 || *restarts < 0:
		fmt.Fprintln(stderr, "handoff chaos: --kills and --redis-restarts must not be negative")
		return 2
	case *redeliver < 0 || *redeliver > 1:
		fmt.Fprintf(stderr, "handoff chaos: --redeliver must be between 0 and 1, got %g\n", *redeliver)
		return 2
	case !slices.Contains(chaos.Targets, cfg.Target):
		fmt.Fprintf(stderr, "handoff chaos: --target must be one of %s, got %q\n", strings.Join(chaos.Targets, ", "), cfg.Target)
		return 2
	case !slices.Contains(chaos.Stores, cfg.Store):
		fmt.Fprintf(stderr, "handoff chaos: --store must be one of %s, got %q\n", strings.Join(chaos.Stores, ", "), cfg.Store)
		return 2
	case cfg.Store == chaos.StoreBolt && (set["redis-restarts"] && *restarts != 0 || set["lease-ttl"]):
		fmt.Fprintf(stderr, "handoff chaos: --redis-restarts and --lease-ttl do not apply to --store %s (handoff up in one process: no Redis, and its coordinator's own lease)\n", chaos.StoreBolt)
		return 2
	case cfg.Wait && cfg.Store != chaos.StoreCluster:
		fmt.Fprintf(stderr, "handoff chaos: --wait needs --store %s (one redis-server has no replica to wait for)\n", chaos.StoreCluster)
		return 2
	case cfg.Concurrency <= 0 || cfg.Deadline <= 0 || cfg.LeaseTTL < time.Second:
		fmt.Fprintln(stderr, "handoff chaos: --concurrency and --deadline must be positive, --lease-ttl at least 1s")
		return 2
	}
	// Config's zero means "default"; the flags' 0 means "none".
	cfg.Kills, cfg.RedisRestarts, cfg.Redeliver = orNone(*kills), orNone(*restarts), *redeliver
	if cfg.Store == chaos.StoreBolt {
		cfg.RedisRestarts = -1 // none: checked above that none were asked
	}
	if cfg.Redeliver == 0 {
		cfg.Redeliver = -1
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "handoff chaos: %v\n", err)
		return 2
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		rep.WriteText(stdout)
	}
	if len(rep.Violations) > 0 {
		return 1
	}
	return 0
}

func orNone(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
