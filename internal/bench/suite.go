package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/bench/peer"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/gctune"
)

// Config configures Run.
type Config struct {
	// Duration is the time spent starting operations, shared by every figure (default 3s).
	// Jobs in flight when a J burst ends are waited for, so the wall time is longer.
	Duration time.Duration
	// RedisAddr is the Redis of figures A, B and J_redis (default DefaultRedisAddr); "off"
	// skips them. When it does not answer, they are reported skipped with the reason.
	RedisAddr string
	// Concurrency is the number of calls in flight in the throughput bursts (default 32;
	// V uses GOMAXPROCS: it is pure CPU).
	Concurrency int
	// JobsConcurrency is the number of jobs in flight in J's throughput bursts (default
	// Concurrency). Each J burst waits for its jobs in flight, which on bbolt is about one
	// job latency under that load.
	JobsConcurrency int
	// BoltDir is where the bbolt files of C, R and J_bolt live (default os.TempDir()).
	BoltDir string
	// TmpfsBolt adds figure C_tmpfs: C with its bbolt file on /dev/shm, where fsync does
	// nothing. NOT DURABLE: it only shows how much of C is the disk.
	TmpfsBolt bool
	// Only, when set, measures just these figures (keys of FigureKeys, or C_tmpfs with
	// TmpfsBolt; CheckOnly says which are valid); the others are reported skipped, and their
	// ratios and targets with them. A2 takes its messages' shape from B's rig and runs on
	// R_floor's bare server, so those start for it, and A runs on echo's bare server; each
	// is measured only when named too.
	Only []string
	// Logger of the services (default: JSON warnings to io.Discard).
	Logger *slog.Logger
	// Progress, when set, gets one line per round.
	Progress io.Writer
}

// Figure is one measured figure.
type Figure struct {
	Key  string `json:"key"`
	What string `json:"what"`
	// Label flags a figure that is not the real configuration.
	Label string  `json:"label,omitempty"`
	P50us float64 `json:"p50_us"`
	P99us float64 `json:"p99_us"`
	// OpsPerSec is completed operations per second of wall time with Concurrency in flight.
	OpsPerSec      float64 `json:"ops_per_sec"`
	Concurrency    int     `json:"concurrency"`
	LatencySamples int     `json:"latency_samples"`
	ThroughputOps  int     `json:"throughput_ops"`
	// CPU per operation in the throughput bursts (A, A2, B, and per job J_redis and J_bolt):
	// the process's (every server and client of the figures, from getrusage), Redis's (INFO
	// cpu deltas: all of its clients, so other users of that Redis inflate it; not for
	// J_bolt, which uses none) and their sum, in microseconds.
	CPUProcessUs *float64 `json:"cpu_process_us_per_op,omitempty"`
	CPURedisUs   *float64 `json:"cpu_redis_us_per_op,omitempty"`
	CPUUs        *float64 `json:"cpu_us_per_op,omitempty"`
	// AgentCalls is how many times the figure's agent ran (R: must be 0).
	AgentCalls *int64 `json:"agent_calls,omitempty"`
	// Anomaly reports something the figure saw that is not a failure of the measurement.
	Anomaly string `json:"anomaly,omitempty"`
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`

	p50, p99 time.Duration
	// rounds holds the figure as each round alone measured it (its latency burst's p50, its
	// throughput burst's ops/s and CPU per op), for the ratios' spread.
	rounds []stat
}

// stat is what a ratio divides: a p50, ops/s, and CPU per op (NaN when not measured).
type stat struct {
	p50      time.Duration
	ops, cpu float64
}

func (f *Figure) stat() stat {
	st := stat{p50: f.p50, ops: f.OpsPerSec, cpu: math.NaN()}
	if f.CPUUs != nil {
		st.cpu = *f.CPUUs
	}
	return st
}

// Ratio is one of the ratios the targets are stated in.
type Ratio struct {
	Value float64 `json:"value"`
	// Rounds is the ratio in each round alone, when both figures ran every round: on a
	// shared machine it moves from burst to burst, and Value alone hides by how much.
	Rounds  []float64 `json:"rounds,omitempty"`
	Skipped string    `json:"skipped,omitempty"`
}

// Target is one target (issues 6 and 22) and whether this run met it.
type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit string  `json:"limit"`
	Met   bool    `json:"met"`
	// Skipped says why it could not be judged.
	Skipped string `json:"skipped,omitempty"`
	// RoundsMet counts the rounds whose own ratio meets the limit, of Rounds (the ratio's
	// Rounds); both are absent when the target has no per-round ratio.
	RoundsMet *int `json:"rounds_met,omitempty"`
	Rounds    int  `json:"rounds,omitempty"`
	// Ceiling, when set, is the best Value this machine allows for any implementation of
	// the design (from a floor figure measured in the same run); Note says how it is derived.
	Ceiling *float64 `json:"ceiling,omitempty"`
	Note    string   `json:"note,omitempty"`
}

// Machine says where the figures came from.
type Machine struct {
	NumCPU     int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPU        string `json:"cpu,omitempty"`
	Go         string `json:"go"`
	OS         string `json:"os"`
	Date       string `json:"date"`
	// Load is /proc/loadavg (1, 5, 15 min) when the run started and ended: the machine is
	// shared, and a load above its CPU count means the figures competed for them.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	Machine     Machine            `json:"machine"`
	Duration    string             `json:"duration"`
	Wall        string             `json:"wall"`
	Rounds      int                `json:"rounds"`
	Burst       string             `json:"burst"`
	Concurrency int                `json:"concurrency"`
	JobsConc    int                `json:"jobs_concurrency"`
	Figures     map[string]*Figure `json:"figures"`
	Ratios      map[string]*Ratio  `json:"ratios"`
	Targets     []Target           `json:"targets"`
	Notes       []string           `json:"notes"`
	order       []string
}

// figure is a Figure being measured.
type figure struct {
	*Figure
	op    func(context.Context, int) error
	conc  int
	agent *CountingAgent
	close func()
	after func() // called once the figure is measured
	// shapeOf, on B's rig, returns what its runner sends (for A2).
	shapeOf func(context.Context) (hopShape, error)
	cpu     *cpuMeter // non-nil: CPU per operation is measured in the throughput bursts

	lat     []time.Duration
	ops     int
	elapsed time.Duration
}

// FigureKeys are the keys of every figure Run reports (C_tmpfs only with Config.TmpfsBolt).
var FigureKeys = []string{"A", "A2", "B", "C", "W_bolt", "R", "R_floor", "echo", "V", "J_redis", "J_bolt", "J_routes", "J_triage", "J_fanout"}

// RatioKeys are the ratios a report may carry, in the order the text prints them
// (C_tmpfs/A_p50 only with Config.TmpfsBolt).
var RatioKeys = []string{"B/A2_p50", "B/A2_throughput", "CPU_B/A2", "R/R_floor_p50", "R/R_floor_throughput",
	"B/A_p50", "C/A_p50", "C_tmpfs/A_p50", "B/A_throughput", "C/A_throughput", "CPU_B/A", "R/echo_p50", "J_routes/J_redis_p50", "J_routes/J_redis_throughput"}

// Run measures every figure, interleaved, and reports them with the ratios and targets.
// A figure whose setup fails for want of Redis is reported skipped; any other failure
// (setup or an operation) is an error in that figure and in the returned error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = 3 * time.Second
	}
	if cfg.RedisAddr == "" {
		cfg.RedisAddr = DefaultRedisAddr
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.JobsConcurrency <= 0 {
		cfg.JobsConcurrency = cfg.Concurrency
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if err := CheckOnly(cfg.Only, cfg.TmpfsBolt); err != nil {
		return nil, err
	}
	selected := func(key string) bool { return len(cfg.Only) == 0 || slices.Contains(cfg.Only, key) }
	// startedFor is the selected figure a figure's rig serves when it is not selected itself:
	// A runs on echo's bare server; A2 takes its shape from B's rig and runs on R_floor's.
	startedFor := func(key string) string {
		switch {
		case key == "echo" && selected("A"):
			return "A"
		case (key == "B" || key == "R_floor") && selected("A2"):
			return "A2"
		}
		return ""
	}
	wallStart := time.Now()
	rep := &Report{Machine: machine(), Concurrency: cfg.Concurrency, JobsConc: cfg.JobsConcurrency, Figures: map[string]*Figure{}, Ratios: map[string]*Ratio{}}
	var figs []*figure
	defer func() {
		for _, f := range figs {
			if f.close != nil {
				f.close()
			}
		}
	}()
	add := func(key, what string, conc int) *figure {
		f := &figure{Figure: &Figure{Key: key, What: what, Concurrency: conc}, conc: conc}
		rep.Figures[key] = f.Figure
		rep.order = append(rep.order, key)
		figs = append(figs, f)
		return f
	}

	redisSkip := ""
	if cfg.RedisAddr == "off" {
		redisSkip = "Redis turned off (--redis off)"
	} else if err := RedisReachable(ctx, cfg.RedisAddr); err != nil {
		redisSkip = fmt.Sprintf("Redis unreachable: %v", err)
	}
	val, err := contract.NewValidator()
	if err != nil {
		return nil, err
	}
	var setupErrs []string
	setup := func(f *figure, needsRedis bool, build func() error) {
		if !selected(f.Key) && startedFor(f.Key) == "" {
			f.Skipped = notSelected
			return
		}
		if needsRedis && redisSkip != "" {
			f.Skipped = redisSkip
			return
		}
		if err := build(); err != nil {
			f.Error = "setup: " + err.Error()
			setupErrs = append(setupErrs, f.Key+": "+f.Error)
		}
	}
	hopRigFor := func(f *figure, kind, baseDir string) func() error {
		return func() error {
			r, err := newHopRig(ctx, hopConfig{Store: kind, RedisAddr: cfg.RedisAddr, BaseDir: baseDir, Workers: cfg.Concurrency, Validator: val, Logger: cfg.Logger})
			if err != nil {
				return err
			}
			f.close, f.agent = r.close, r.agent
			f.op, f.shapeOf = r.hop, r.captureShape
			if f.Key == "R" {
				f.op = r.rejected
			}
			return nil
		}
	}

	fA := add("A", "bare hop: gRPC unary, 1 KiB over 127.0.0.1 TCP, handler does one Redis SET NX PX; no interceptors", cfg.Concurrency)
	fA2 := add("A2", "honest floor of B: the runner's Deliver on a plain gRPC server (no interceptors), handler runs the store's Admit (claim + debit, one Lua script), sends an ack and a result of B's shape, then Completes; client then one PutRun of B's run", cfg.Concurrency)
	fB := add("B", "platform hop on Redis: ~2 KB package, coordinator token, full agent-runner chain, Noop agent, Ack+StageResult received, then one PutRun", cfg.Concurrency)
	fC := add("C", "platform hop on bbolt (fsync per write transaction): as B", cfg.Concurrency)
	fW := add("W_bolt", "one bbolt write transaction (a Claim of a fresh key) in the same folder as C's file: the unit C's store writes cost (2 transactions in sequence per hop)", cfg.Concurrency)
	var fCT *figure
	if cfg.TmpfsBolt {
		fCT = add("C_tmpfs", "as C with the bbolt file on /dev/shm (tmpfs): fsync does nothing", cfg.Concurrency)
		fCT.Label = "NOT DURABLE: bbolt on tmpfs, for attributing C's cost to the disk only"
	}
	fR := add("R", "rejected package (no goal): REJECTED_SCHEMA Ack round trip through the full chain; agent must not run", cfg.Concurrency)
	fRF := add("R_floor", "floor of R: the bare Deliver stream returning one message (REJECTED_SCHEMA), its handler running V on the package", cfg.Concurrency)
	fE := add("echo", "bare gRPC unary echo, 1 KiB each way over 127.0.0.1 TCP; no interceptors, no Redis", cfg.Concurrency)
	fV := add("V", "contract.Validator.CheckV1 of the ~2 KB package, in process", runtime.GOMAXPROCS(0))
	fJR := add("J_redis", "5-stage Noop job through the coordinator on Redis: SubmitJob + WatchJob until COMPLETED", cfg.JobsConcurrency)
	fJRt := add("J_routes", "J_redis with routes: each of the 5 stages declares two routes, its agent answers with one, the rail checks it and moves the job along it", cfg.JobsConcurrency)
	fJT := add("J_triage", "the shipped support-triage pipeline on bbolt (stack.Start): the billing ticket routed to its desk, retrieved, drafted, judged PASS and written once", cfg.JobsConcurrency)
	fJB := add("J_bolt", "5-stage Noop job through the coordinator on bbolt (stack.Start, as `handoff up`): SubmitJob + WatchJob until COMPLETED", cfg.JobsConcurrency)
	fJF := add("J_fanout", "fan-out job on bbolt: three parallel Noop branches and a Noop merge through the coordinator (stack.Start): SubmitJob + WatchJob until COMPLETED", cfg.JobsConcurrency)

	// One bare server serves A (Hop, needs Redis) and echo.
	var bareR *bareRig
	setup(fE, false, func() error {
		addr := cfg.RedisAddr
		if redisSkip != "" {
			addr = ""
		}
		r, err := newBareRig(ctx, addr, cfg.Concurrency)
		if err != nil {
			return err
		}
		bareR, fE.close, fE.op = r, r.close, r.echo
		return nil
	})
	setup(fA, true, func() error {
		if bareR == nil {
			return fmt.Errorf("the bare server did not start")
		}
		fA.op = bareR.hop
		return nil
	})
	setup(fB, true, hopRigFor(fB, StoreRedis, ""))
	// A2 and R_floor share one bare Deliver server. A2 sends what B's runner sends, so it
	// takes its shape from one B hop (without B, A2 is skipped with it).
	setup(fRF, false, func() error {
		addr, shape := cfg.RedisAddr, hopShape{}
		if redisSkip != "" || fB.op == nil {
			addr = ""
		} else {
			var err error
			if shape, err = fB.shapeOf(ctx); err != nil {
				return fmt.Errorf("the shape of figure B's hop: %w", err)
			}
		}
		r, err := newFloorRig(ctx, addr, cfg.Concurrency, val, shape)
		if err != nil {
			return err
		}
		fRF.close, fRF.op = r.close, r.rejected
		if addr != "" {
			fA2.op = r.hop
		}
		return nil
	})
	setup(fA2, true, func() error {
		if fA2.op == nil {
			return fmt.Errorf("A2 needs figure B's rig, which did not start")
		}
		return nil
	})
	fA.cpu, fA2.cpu, fB.cpu = &cpuMeter{}, &cpuMeter{}, &cpuMeter{}
	// A job's CPU: every service of the platform and its client run in this process, so
	// the process's CPU is all of it but Redis's (J_redis); J_bolt touches no Redis.
	fJR.cpu, fJB.cpu = &cpuMeter{}, &cpuMeter{procOnly: true}
	setup(fC, false, hopRigFor(fC, StoreBolt, cfg.BoltDir))
	if fCT != nil {
		setup(fCT, false, func() error {
			if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
				return fmt.Errorf("no /dev/shm")
			}
			return hopRigFor(fCT, StoreBolt, "/dev/shm")()
		})
	}
	setup(fW, false, func() error {
		w, err := newBoltWriter(cfg.BoltDir)
		if err != nil {
			return err
		}
		fW.op, fW.close = w.write, w.close
		return nil
	})
	setup(fR, false, hopRigFor(fR, StoreBolt, cfg.BoltDir))
	setup(fV, false, func() error {
		p := newTemplate(benchStage).make("bench-0123456789abcdef-01", newTraceparent(nil), "run_0123456789abcdef_0001")
		fV.op = func(context.Context, int) error {
			if rs := val.CheckV1(p); len(rs) > 0 {
				return fmt.Errorf("CheckV1 rejected the benchmark package: %v", rs)
			}
			return nil
		}
		return nil
	})
	jobsRigFor := func(f *figure, kind string) func() error {
		return func() error {
			pipe := JobsPipeline
			if f.Key == "J_routes" {
				pipe = RoutesPipeline
			}
			newRig := func(ctx context.Context, kind, addr, dir string, log *slog.Logger) (*jobsRig, error) {
				return newJobsRigFor(ctx, pipe, kind, addr, dir, log)
			}
			if f.Key == "J_fanout" {
				newRig = newFanoutRig
			}
			r, err := newRig(ctx, kind, cfg.RedisAddr, cfg.BoltDir, cfg.Logger)
			if err != nil {
				return err
			}
			f.close, f.op = r.close, r.job
			f.after = func() {
				if n := r.missedEnd.Load(); n > 0 {
					f.Anomaly = fmt.Sprintf("WatchJob ended %d times before streaming the COMPLETED event (the run's state was COMPLETED); the coordinator saves the two in one write, so this is a bug", n)
				}
			}
			return nil
		}
	}
	setup(fJR, true, jobsRigFor(fJR, StoreRedis))
	setup(fJB, false, jobsRigFor(fJB, StoreBolt))
	setup(fJF, false, jobsRigFor(fJF, StoreBolt))
	setup(fJRt, true, jobsRigFor(fJRt, StoreRedis))
	setup(fJT, false, func() error {
		r, err := newTriageRig(ctx, cfg.BoltDir, cfg.Logger)
		if err != nil {
			return err
		}
		fJT.close, fJT.op = r.close, r.job
		return nil
	})

	// Redis's CPU for the CPU per operation (INFO cpu).
	var cpuRedis *redis.Client
	if redisSkip == "" {
		if cpuRedis, err = newRedis(ctx, cfg.RedisAddr); err != nil {
			return nil, err
		}
		defer cpuRedis.Close()
	}

	// Rigs started for A or A2 are not measured unless named.
	for _, f := range figs {
		if !selected(f.Key) && f.Skipped == "" && f.Error == "" {
			f.Skipped, f.op = notSelected+"; its rig was started for "+startedFor(f.Key), nil
		}
	}

	// Warm up: connections, Lua scripts, bbolt buckets, CEL programs.
	var active []*figure
	for _, f := range figs {
		if f.op == nil {
			continue
		}
		n := 20
		if strings.HasPrefix(f.Key, "J") {
			n = 2
		}
		for range n {
			if err := f.op(ctx, 0); err != nil {
				f.Error = "warm-up: " + err.Error()
				break
			}
		}
		if f.Error == "" {
			active = append(active, f)
		}
	}

	// Round-robin: every figure gets a serial burst (latency) and a concurrent burst
	// (throughput) per round, so drift of the shared machine hits all of them alike.
	slots := 2 * max(len(active), 1)
	burst := min(max(cfg.Duration/time.Duration(slots*5), 10*time.Millisecond), 100*time.Millisecond)
	rep.Rounds = max(1, int(cfg.Duration/(burst*time.Duration(slots))))
	rep.Burst, rep.Duration = burst.String(), cfg.Duration.String()
	for round := range rep.Rounds {
		for _, f := range active {
			if f.Error != "" || ctx.Err() != nil {
				continue
			}
			var before int64
			if f.agent != nil {
				before = f.agent.Calls()
			}
			if err := f.round(ctx, burst, cpuRedis); err != nil {
				f.Error = err.Error()
				continue
			}
			if f.agent != nil {
				n := f.agent.Calls() - before
				if f.AgentCalls == nil {
					f.AgentCalls = new(int64)
				}
				*f.AgentCalls += n
			}
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "round %d/%d done (%s)\n", round+1, rep.Rounds, time.Since(wallStart).Round(time.Millisecond))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, f := range figs {
		if f.after != nil {
			f.after()
		}
		if f.op == nil || len(f.lat) == 0 {
			continue
		}
		f.p50, f.p99 = quantiles(f.lat)
		f.P50us, f.P99us = micros(f.p50), micros(f.p99)
		f.LatencySamples, f.ThroughputOps = len(f.lat), f.ops
		if f.elapsed > 0 {
			f.OpsPerSec = peer.Round2(float64(f.ops) / f.elapsed.Seconds())
		}
		if f.cpu != nil {
			if f.cpu.err != nil {
				if f.Anomaly != "" { // a J figure's rig may have reported one (f.after): keep it
					f.Anomaly += "; "
				}
				f.Anomaly += "CPU per operation not measured: " + f.cpu.err.Error()
			} else if proc, rd, total, ok := f.cpu.perOp(); ok {
				f.CPUProcessUs, f.CPUUs = &proc, &total
				if !f.cpu.procOnly {
					f.CPURedisUs = &rd
				}
			}
		}
	}
	rep.ratiosAndTargets()
	rep.Notes = notes(cfg)
	rep.Wall = time.Since(wallStart).Round(time.Millisecond).String()
	rep.Machine.LoadEnd = peer.Loadavg()
	var errs []string
	for _, k := range rep.order {
		if f := rep.Figures[k]; f.Error != "" {
			errs = append(errs, k+": "+f.Error)
		}
	}
	if len(errs) > 0 {
		return rep, fmt.Errorf("bench: %s", strings.Join(errs, "; "))
	}
	return rep, nil
}

// round is one round of the figure: a serial burst for latency, then a concurrent one for
// ops/s and CPU (metered with rdb's INFO cpu when set), each lasting d; the round alone is
// kept in f.rounds.
func (f *figure) round(ctx context.Context, d time.Duration, rdb *redis.Client) error {
	mark := f.mark()
	if err := f.latencyBurst(ctx, d); err != nil {
		return err
	}
	if err := f.meteredThroughputBurst(ctx, d, rdb); err != nil {
		return err
	}
	f.rounds = append(f.rounds, f.since(mark))
	return nil
}

// notSelected is why a figure left out by Config.Only is skipped.
const notSelected = "not selected (--only)"

// CheckOnly returns an error naming the first entry of only that is not a figure Run
// measures (C_tmpfs counts only with tmpfs, as Config.TmpfsBolt).
func CheckOnly(only []string, tmpfs bool) error {
	for _, k := range only {
		switch {
		case k == "":
			return fmt.Errorf("bench: --only has an empty figure name (figures: %s)", strings.Join(FigureKeys, ", "))
		case k == "C_tmpfs" && !tmpfs:
			return fmt.Errorf("bench: --only names C_tmpfs, which is measured only with --tmpfs-bolt")
		case k != "C_tmpfs" && !slices.Contains(FigureKeys, k):
			return fmt.Errorf("bench: --only names %q, which is not a figure (figures: %s, and C_tmpfs with --tmpfs-bolt)", k, strings.Join(FigureKeys, ", "))
		}
	}
	return nil
}

// roundMark is where a figure's counters stood when a round began.
type roundMark struct {
	lat, ops          int
	elapsed           time.Duration
	cpuProc, cpuRedis time.Duration
	cpuOps            int
}

func (f *figure) mark() roundMark {
	m := roundMark{lat: len(f.lat), ops: f.ops, elapsed: f.elapsed}
	if f.cpu != nil {
		m.cpuProc, m.cpuRedis, m.cpuOps = f.cpu.proc, f.cpu.redis, f.cpu.ops
	}
	return m
}

// since is the figure as measured from m on: one round's bursts.
func (f *figure) since(m roundMark) stat {
	st := stat{cpu: math.NaN()}
	if lat := f.lat[m.lat:]; len(lat) > 0 {
		st.p50, _ = Quantiles(lat)
	}
	if el := f.elapsed - m.elapsed; el > 0 {
		st.ops = float64(f.ops-m.ops) / el.Seconds()
	}
	if f.cpu != nil && f.cpu.err == nil {
		if n := f.cpu.ops - m.cpuOps; n > 0 {
			st.cpu = float64(f.cpu.proc-m.cpuProc+f.cpu.redis-m.cpuRedis) / float64(time.Microsecond) / float64(n)
		}
	}
	return st
}

// latencyBurst runs op one at a time for d (at least once), recording each latency.
func (f *figure) latencyBurst(ctx context.Context, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		t := time.Now()
		if err := f.op(ctx, 0); err != nil {
			return err
		}
		f.lat = append(f.lat, time.Since(t))
		if time.Now().After(end) || ctx.Err() != nil {
			return nil
		}
	}
}

// throughputBurst keeps f.conc operations in flight until d has passed (each worker starts
// at least one), waits for the last to finish, and counts them against that wall time.
func (f *figure) throughputBurst(ctx context.Context, d time.Duration) error {
	start := time.Now()
	end := start.Add(d)
	counts := make([]int, f.conc)
	errs := make([]error, f.conc)
	var wg sync.WaitGroup
	for w := range f.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := f.op(ctx, w); err != nil {
					errs[w] = err
					return
				}
				counts[w]++
				if time.Now().After(end) || ctx.Err() != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	f.elapsed += time.Since(start)
	for w := range f.conc {
		if errs[w] != nil {
			return errs[w]
		}
		f.ops += counts[w]
	}
	return nil
}

// meteredThroughputBurst is throughputBurst, adding the CPU the process and Redis (when
// rdb is set) used during it to the figure's meter, if it has one.
func (f *figure) meteredThroughputBurst(ctx context.Context, d time.Duration, rdb *redis.Client) error {
	if f.cpu == nil {
		return f.throughputBurst(ctx, d)
	}
	var r0, r1 time.Duration
	var rerr error
	if f.cpu.procOnly {
		rdb = nil
	}
	if rdb != nil {
		r0, rerr = redisCPU(ctx, rdb)
	}
	ops0, p0 := f.ops, processCPU()
	err := f.throughputBurst(ctx, d)
	p1 := processCPU()
	if rdb != nil && rerr == nil {
		r1, rerr = redisCPU(ctx, rdb)
	}
	if rerr != nil && f.cpu.err == nil {
		f.cpu.err = rerr
	}
	f.cpu.add(p1-p0, r1-r0, f.ops-ops0)
	return err
}

func (rep *Report) ratiosAndTargets() {
	fig := func(k string) *Figure { return rep.Figures[k] }
	usable := func(k string) string {
		f := fig(k)
		switch {
		case f == nil:
			return k + " not measured"
		case f.Skipped != "":
			return k + " skipped: " + f.Skipped
		case f.Error != "":
			return k + " failed"
		case f.LatencySamples == 0:
			return k + " has no samples"
		}
		return ""
	}
	ratio := func(name, a, b string, get func(stat) float64) *Ratio {
		if why := usable(a); why != "" {
			rep.Ratios[name] = &Ratio{Skipped: why}
		} else if why := usable(b); why != "" {
			rep.Ratios[name] = &Ratio{Skipped: why}
		} else {
			rep.Ratios[name] = &Ratio{Value: peer.Round2(get(fig(a).stat()) / get(fig(b).stat())), Rounds: perRound(fig(a), fig(b), get)}
		}
		return rep.Ratios[name]
	}
	p50 := func(s stat) float64 { return float64(s.p50) }
	ops := func(s stat) float64 { return s.ops }
	target := func(name, limit string, r *Ratio, met func(float64) bool) {
		t := Target{Name: name, Limit: limit, Value: r.Value, Skipped: r.Skipped}
		if r.Skipped == "" {
			m, n := peer.Judge(r.Value, r.Rounds, met)
			t.Met, t.RoundsMet, t.Rounds = *m, n, len(r.Rounds)
		}
		rep.Targets = append(rep.Targets, t)
	}
	ratio("B/A_p50", "B", "A", p50)
	ratio("C/A_p50", "C", "A", p50)
	if fig("C_tmpfs") != nil {
		ratio("C_tmpfs/A_p50", "C_tmpfs", "A", p50)
	}
	ratio("B/A_throughput", "B", "A", ops)
	ratio("C/A_throughput", "C", "A", ops)
	ratio("R/echo_p50", "R", "echo", p50)

	// Issue 22's targets are stated against the floors (A2, R_floor), not against A and echo,
	// which lack the durable work the hop keeps.
	bA2 := ratio("B/A2_p50", "B", "A2", p50)
	bA2t := ratio("B/A2_throughput", "B", "A2", ops)
	rF := ratio("R/R_floor_p50", "R", "R_floor", p50)
	ratio("R/R_floor_throughput", "R", "R_floor", ops)
	cpuRatio := func(name, a, b string) *Ratio {
		r := ratio(name, a, b, func(s stat) float64 { return s.cpu })
		if r.Skipped == "" && math.IsNaN(r.Value) {
			*r = Ratio{Skipped: "CPU per operation not measured for " + a + " or " + b}
		}
		return r
	}
	cB := cpuRatio("CPU_B/A2", "B", "A2")
	ratio("J_routes/J_redis_p50", "J_routes", "J_redis", p50)
	ratio("J_routes/J_redis_throughput", "J_routes", "J_redis", ops)
	cpuRatio("CPU_B/A", "B", "A")
	target("B/A2 at p50", "<= 1.5 (goal 1.3)", bA2, func(v float64) bool { return v <= 1.5 })
	target("throughput B/A2", ">= 0.60", bA2t, func(v float64) bool { return v >= 0.60 })
	target("CPU per hop B/A2", "<= 2.0", cB, func(v float64) bool { return v <= 2 })
	target("R/R_floor at p50", "<= 1.3", rF, func(v float64) bool { return v <= 1.3 })
	calls := &Ratio{Skipped: usable("R")}
	if f := fig("R"); calls.Skipped == "" && f.AgentCalls != nil {
		calls.Value = float64(*f.AgentCalls)
	}
	target("agent calls for rejected packages (R)", "== 0", calls, func(v float64) bool { return v == 0 })
	v := &Ratio{Skipped: usable("V")}
	if v.Skipped == "" {
		v.Value = fig("V").P50us
	}
	target("V p50 (µs)", "< 20", v, func(x float64) bool { return x < 20 })

	jr := &Ratio{Skipped: usable("J_redis")}
	if jr.Skipped == "" {
		jr.Value = peer.Round2(fig("J_redis").OpsPerSec)
	}
	jTarget := JobsTargetVsTemporal * TemporalJobsPerSec
	target("J_redis jobs/s", fmt.Sprintf(">= %.0f (%.0f × Temporal's %.0f)", jTarget, JobsTargetVsTemporal, TemporalJobsPerSec), jr,
		func(x float64) bool { return x >= jTarget })
	jt := &rep.Targets[len(rep.Targets)-1]
	if c := jobsCeiling(fig("A2"), usable("A2"), rep.Machine.NumCPU); c.Skipped != "" {
		jt.Note = "ceiling not computed: " + c.Skipped
	} else {
		jt.Ceiling = &c.Value
		jt.Note = fmt.Sprintf("ceiling on this machine at the floor hop's CPU: %.0f jobs/s = %d CPUs / (5 hops × A2's %.1f µs per op)", c.Value, rep.Machine.NumCPU, *fig("A2").CPUUs)
		if c.Value < jTarget {
			jt.Note += "; the target is above it, so no rail of this design meets it here"
		}
	}
	if own := ownCeiling(fig("J_redis"), rep.Machine.NumCPU); own > 0 {
		jt.Note += fmt.Sprintf("; at J_redis's own CPU per job (%.0f µs, process + Redis) %d CPUs allow %.0f jobs/s", *fig("J_redis").CPUUs, rep.Machine.NumCPU, own)
	}
}

// ownCeiling is the most jobs per second ncpu CPUs allow at a J figure's own CPU per job
// (its throughput bursts' CPU/op), all of them busy and nothing waiting on a disk: the
// figure's jobs/s against it says how much of the gap to a target is CPU. 0 when the figure
// was not measured.
func ownCeiling(j *Figure, ncpu int) float64 {
	if j == nil || j.Skipped != "" || j.Error != "" || j.CPUUs == nil {
		return 0
	}
	return math.Round(peer.CPUCeiling(ncpu, *j.CPUUs/1000))
}

// perRound is get(a)/get(b) in each round (peer.RoundRatios), or nil unless both figures
// ran every round and every round's value of both is a finite positive number.
func perRound(a, b *Figure, get func(stat) float64) []float64 {
	values := func(rounds []stat) []float64 {
		out := make([]float64, len(rounds))
		for i, st := range rounds {
			out[i] = get(st)
		}
		return out
	}
	return peer.RoundRatios(values(a.rounds), values(b.rounds))
}

// TemporalJobsPerSec is tuned Temporal's jobs/s on this machine kind for the same five-stage
// relay (issue 22's orientation figure; bench/temporal measures it), and JobsTargetVsTemporal
// the factor J_redis is to reach over it.
const (
	TemporalJobsPerSec   = 63.0
	JobsTargetVsTemporal = 30.0
)

// jobsCeiling is the most five-stage jobs per second this machine could run if each hop
// cost only what the honest floor hop A2 costs (the admission script, the ack-and-result
// stream, the Complete and the coordinator's save, process and Redis CPU together) and the
// rest of the job (submit, watch, driving) were free: ncpu / (5 × A2's CPU per op). No
// implementation of this design exceeds it on this machine, so a J target above it is
// missed on the hardware, not in the rail.
func jobsCeiling(a2 *Figure, unusable string, ncpu int) *Ratio {
	switch {
	case unusable != "":
		return &Ratio{Skipped: unusable}
	case a2.CPUUs == nil || *a2.CPUUs <= 0:
		return &Ratio{Skipped: "CPU per operation not measured for A2"}
	case ncpu <= 0:
		return &Ratio{Skipped: "CPU count unknown"}
	}
	const hopsPerJob = 5
	floorMsPerJob := hopsPerJob * *a2.CPUUs / 1000
	return &Ratio{Value: math.Round(peer.CPUCeiling(ncpu, floorMsPerJob))}
}

func notes(cfg Config) []string {
	boltDir := cfg.BoltDir
	if boltDir == "" {
		boltDir = os.TempDir()
	}
	return []string{
		"one process: every server and client shares the machine's CPUs; loopback TCP throughout",
		"latency: serial bursts (one call in flight); ops/s: bursts with the figure's concurrency in flight, counted against wall time including the drain",
		"services log JSON at warn level to io.Discard (handoff up's default level); tracing: SDK provider, no exporter unless OTEL_EXPORTER_OTLP_ENDPOINT is set; metrics on",
		"B/C record a hop as the coordinator does after a result: one store.PutRun of the run with the hop's ACK and STAGE_RESULT events; B/C packages carry a wallet_id, so the runner claims the stage and debits the stored wallet in one store.Admit, then Completes just after sending the result, overlapping the PutRun (3 store writes per hop, 2 in sequence; on bbolt the Complete shares the PutRun's transaction)",
		fmt.Sprintf("bbolt files of C, R and J_bolt under %s; each write transaction fsyncs", boltDir),
		"J: latency one job at a time; jobs/s with the concurrency in flight; J_redis is stack.Start's assembly rebuilt on store.OpenRedis (stack.Start only opens bbolt)",
		gcNote(),
	}
}

// gcNote says what GC policy the figures ran under: the handoff binary applies its services'
// (internal/gctune) before any command, a Go test binary runs with Go's own.
func gcNote() string {
	ms := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(ms)
	if ms[0].Value.Kind() != metrics.KindUint64 || ms[1].Value.Kind() != metrics.KindUint64 {
		return "GC: policy unknown (runtime/metrics has no gogc or gomemlimit)"
	}
	limit := "none"
	if l := ms[1].Value.Uint64(); l < math.MaxInt64 {
		limit = fmt.Sprintf("%d MiB", l>>20)
	}
	return fmt.Sprintf("GC: GOGC=%d, GOMEMLIMIT %s (the handoff binary's default is GOGC=%d, internal/gctune)", ms[0].Value.Uint64(), limit, gctune.DefaultGOGC)
}

func machine() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, Date: time.Now().UTC().Format(time.RFC3339), LoadStart: peer.Loadavg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteText writes the report as a table.
func (rep *Report) WriteText(w io.Writer) {
	m := rep.Machine
	fmt.Fprintf(w, "handoff bench: %d CPUs (GOMAXPROCS %d) %s, %s %s, %s, load %s -> %s\n", m.NumCPU, m.GOMAXPROCS, m.CPU, m.Go, m.OS, m.Date, m.LoadStart, m.LoadEnd)
	fmt.Fprintf(w, "%s measuring in %d rounds of %s bursts per figure and mode, %d calls (%d jobs) in flight for ops/s; wall %s\n\n", rep.Duration, rep.Rounds, rep.Burst, rep.Concurrency, rep.JobsConc, rep.Wall)
	fmt.Fprintf(w, "%-8s %11s %11s %11s %5s  %s\n", "figure", "p50", "p99", "ops/s", "conc", "what")
	for _, k := range rep.order {
		f := rep.Figures[k]
		switch {
		case f.Skipped != "":
			fmt.Fprintf(w, "%-8s %11s %11s %11s %5s  skipped: %s\n", k, "-", "-", "-", "-", f.Skipped)
		case f.Error != "":
			fmt.Fprintf(w, "%-8s %11s %11s %11s %5s  ERROR: %s\n", k, "-", "-", "-", "-", f.Error)
		default:
			what := f.What
			if f.AgentCalls != nil {
				what += fmt.Sprintf(" [agent calls %d]", *f.AgentCalls)
			}
			if f.Anomaly != "" {
				what += " [ANOMALY: " + f.Anomaly + "]"
			}
			if f.Label != "" {
				what = "[" + f.Label + "] " + what
			}
			switch {
			case f.CPUUs != nil && f.CPURedisUs != nil:
				what += fmt.Sprintf(" [CPU/op %.1fµs = process %.1f + Redis %.1f]", *f.CPUUs, *f.CPUProcessUs, *f.CPURedisUs)
			case f.CPUUs != nil:
				what += fmt.Sprintf(" [CPU/op %.1fµs, the process's: no Redis]", *f.CPUUs)
			}
			fmt.Fprintf(w, "%-8s %11s %11s %11.0f %5d  %s\n", k, dur(f.p50), dur(f.p99), f.OpsPerSec, f.Concurrency, what)
		}
	}
	fmt.Fprintln(w, "\nratios")
	for _, k := range RatioKeys {
		r, ok := rep.Ratios[k]
		switch {
		case !ok:
		case r.Skipped != "":
			fmt.Fprintf(w, "  %-20s skipped (%s)\n", k, r.Skipped)
		case len(r.Rounds) > 0:
			fmt.Fprintf(w, "  %-20s %.2f  (rounds %.2f to %.2f)\n", k, r.Value, slices.Min(r.Rounds), slices.Max(r.Rounds))
		default:
			fmt.Fprintf(w, "  %-20s %.2f\n", k, r.Value)
		}
	}
	fmt.Fprintln(w, "\ntargets")
	for _, t := range rep.Targets {
		verdict := "MISSED"
		switch {
		case t.Skipped != "":
			verdict = "skipped (" + t.Skipped + ")"
		case t.Met:
			verdict = "met"
		}
		if t.RoundsMet != nil {
			verdict += fmt.Sprintf(" (rounds alone: %d of %d met it)", *t.RoundsMet, t.Rounds)
		}
		fmt.Fprintf(w, "  %-40s %8.2f  %-18s %s\n", t.Name, t.Value, t.Limit, verdict)
		if t.Note != "" {
			fmt.Fprintf(w, "  %-40s %s\n", "", t.Note)
		}
	}
	fmt.Fprintln(w, "\nnotes")
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "  -", n)
	}
}

func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	}
}
