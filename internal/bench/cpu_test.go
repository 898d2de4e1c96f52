package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// testRedis is the test Redis's address (the rigs make and delete their own prefixes);
// without it the test fails under CI and skips otherwise.
func testRedis(t *testing.T) string {
	t.Helper()
	storetest.RedisClient(t)
	return storetest.RedisAddr()
}

func TestParseRedisCPU(t *testing.T) {
	for _, tc := range []struct {
		name, info string
		want       time.Duration
		err        string
	}{
		{"both fields summed", "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n", 3750 * time.Millisecond, ""},
		{"children and main thread ignored", "used_cpu_sys_main_thread:7\nused_cpu_user:0.5\nused_cpu_sys:0.25\nused_cpu_user_children:8\n", 750 * time.Millisecond, ""},
		{"user missing", "used_cpu_sys:1.0\n", 0, "found 1 of them"},
		{"empty", "", 0, "found 0 of them"},
		{"not a number", "used_cpu_sys:abc\nused_cpu_user:1\n", 0, `used_cpu_sys is "abc"`},
		{"negative", "used_cpu_sys:-1\nused_cpu_user:1\n", 0, `used_cpu_sys is "-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRedisCPU(tc.info)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseRedisCPU = %v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseRedisCPU = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestCPUMeterPerOp(t *testing.T) {
	var m cpuMeter
	if _, _, _, ok := m.perOp(); ok {
		t.Fatal("a meter without operations must not report a figure")
	}
	m.add(3*time.Millisecond, time.Millisecond, 10)
	m.add(time.Millisecond, -time.Second, 30) // a Redis restart makes a negative delta: counted as 0
	proc, rd, total, ok := m.perOp()
	if !ok || proc != 100 || rd != 25 || total != 125 {
		t.Fatalf("perOp = %v, %v, %v, %v; want 100, 25, 125 µs", proc, rd, total, ok)
	}
}

func TestProcessCPUAdvances(t *testing.T) {
	before := processCPU()
	x := 0
	for i := range 50_000_000 {
		x += i % 7
	}
	if after := processCPU(); after <= before || x == 0 {
		t.Fatalf("process CPU went from %v to %v over a busy loop", before, after)
	}
}

// TestRatiosAndTargetsFromFigures checks the issue-22 ratios and their JSON from figures
// with known values.
func TestRatiosAndTargetsFromFigures(t *testing.T) {
	cpu := func(v float64) *float64 { return &v }
	fig := func(key string, p50 time.Duration, ops float64, cpuUs *float64) *Figure {
		return &Figure{Key: key, p50: p50, P50us: micros(p50), OpsPerSec: ops, LatencySamples: 10, CPUUs: cpuUs}
	}
	rep := &Report{Figures: map[string]*Figure{
		"A":       fig("A", 100*time.Microsecond, 10000, cpu(100)),
		"A2":      fig("A2", 300*time.Microsecond, 4000, cpu(200)),
		"B":       fig("B", 390*time.Microsecond, 2000, cpu(500)),
		"R":       fig("R", 130*time.Microsecond, 9000, nil),
		"R_floor": fig("R_floor", 100*time.Microsecond, 10000, nil),
		"echo":    fig("echo", 50*time.Microsecond, 20000, nil),
		"V":       fig("V", 15*time.Microsecond, 1e5, nil),
	}, Ratios: map[string]*Ratio{}}
	zero := int64(0)
	rep.Figures["R"].AgentCalls = &zero
	rep.ratiosAndTargets()
	want := map[string]float64{"B/A2_p50": 1.3, "B/A2_throughput": 0.5, "CPU_B/A2": 2.5, "R/R_floor_p50": 1.3, "R/R_floor_throughput": 0.9, "CPU_B/A": 5, "B/A_p50": 3.9}
	for k, v := range want {
		if r := rep.Ratios[k]; r == nil || r.Skipped != "" || r.Value != v {
			t.Errorf("ratio %s = %+v, want %v", k, r, v)
		}
	}
	if r := rep.Ratios["C/A_p50"]; r == nil || r.Skipped != "C not measured" {
		t.Errorf("C/A_p50 = %+v, want skipped: C not measured", r)
	}
	met := map[string]bool{}
	for _, tg := range rep.Targets {
		met[tg.Name] = tg.Met
	}
	for name, m := range map[string]bool{"B/A2 at p50": true, "throughput B/A2": false, "CPU per hop B/A2": false, "R/R_floor at p50": true, "agent calls for rejected packages (R)": true, "V p50 (µs)": true} {
		if got, ok := met[name]; !ok || got != m {
			t.Errorf("target %q met=%v (present %v), want %v", name, got, ok, m)
		}
	}
	// The CPU figures are in the JSON under their documented names.
	b, err := json.Marshal(&Figure{Key: "B", CPUProcessUs: cpu(1.5), CPURedisUs: cpu(0.5), CPUUs: cpu(2)})
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["cpu_process_us_per_op"] != 1.5 || back["cpu_redis_us_per_op"] != 0.5 || back["cpu_us_per_op"] != 2.0 {
		t.Errorf("CPU JSON = %s", b)
	}
	// Without a CPU figure the CPU ratio is skipped, not NaN (which JSON cannot carry).
	rep2 := &Report{Figures: map[string]*Figure{"A2": fig("A2", 1, 1, nil), "B": fig("B", 1, 1, cpu(1))}, Ratios: map[string]*Ratio{}}
	rep2.ratiosAndTargets()
	if r := rep2.Ratios["CPU_B/A2"]; r.Skipped == "" {
		t.Errorf("CPU_B/A2 without A2's CPU = %+v, want skipped", r)
	}
	if _, err := json.Marshal(rep2); err != nil {
		t.Errorf("report JSON: %v", err)
	}
}

// TestRatiosPerRound: a ratio carries its value in each round alone when both figures ran
// every round, and a target counts the rounds whose own ratio meets it; rounds that cannot
// be paired or divided leave the ratio without them rather than with a wrong spread.
func TestRatiosPerRound(t *testing.T) {
	cpu := func(v float64) *float64 { return &v }
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	fig := func(key string, p50 time.Duration, ops float64, cpuUs *float64, rounds ...stat) *Figure {
		return &Figure{Key: key, p50: p50, P50us: micros(p50), OpsPerSec: ops, LatencySamples: 10, CPUUs: cpuUs, rounds: rounds}
	}
	nan := math.NaN()
	rep := &Report{Figures: map[string]*Figure{
		"A2": fig("A2", us(300), 4000, cpu(200),
			stat{us(300), 4000, 200}, stat{us(200), 5000, 100}, stat{us(400), 3000, 250}),
		"B": fig("B", us(420), 2600, cpu(390),
			stat{us(420), 2600, 390}, stat{us(320), 2000, 250}, stat{us(480), 2100, 450}),
		// R_floor ran one round fewer than R: R/R_floor gets no rounds.
		"R":       fig("R", us(130), 9000, nil, stat{us(130), 9000, nan}, stat{us(120), 9500, nan}),
		"R_floor": fig("R_floor", us(100), 10000, nil, stat{us(100), 10000, nan}),
	}, Ratios: map[string]*Ratio{}}
	rep.ratiosAndTargets()
	for k, want := range map[string][]float64{
		"B/A2_p50":        {1.4, 1.6, 1.2},
		"B/A2_throughput": {0.65, 0.4, 0.7},
		"CPU_B/A2":        {1.95, 2.5, 1.8},
	} {
		if r := rep.Ratios[k]; r == nil || !slices.Equal(r.Rounds, want) {
			t.Errorf("%s rounds = %+v, want %v", k, r, want)
		}
	}
	if r := rep.Ratios["R/R_floor_p50"]; r == nil || r.Rounds != nil || r.Value != 1.3 {
		t.Errorf("R/R_floor_p50 = %+v, want 1.3 and no rounds (R_floor ran fewer)", r)
	}
	met := map[string]*Target{}
	for i := range rep.Targets {
		met[rep.Targets[i].Name] = &rep.Targets[i]
	}
	for name, want := range map[string][2]int{"B/A2 at p50": {2, 3}, "throughput B/A2": {2, 3}, "CPU per hop B/A2": {2, 3}} {
		tg := met[name]
		if tg == nil || tg.RoundsMet == nil || *tg.RoundsMet != want[0] || tg.Rounds != want[1] {
			t.Errorf("target %q = %+v, want met in %d of %d rounds", name, tg, want[0], want[1])
		}
	}
	if tg := met["R/R_floor at p50"]; tg == nil || tg.RoundsMet != nil || tg.Rounds != 0 {
		t.Errorf("R/R_floor target = %+v, want no round count", tg)
	}
	// A round without a CPU figure (NaN) drops the CPU ratio's rounds, not just that round.
	rep.Figures["A2"].rounds[1].cpu = nan
	rep.Ratios = map[string]*Ratio{}
	rep.Targets = nil
	rep.ratiosAndTargets()
	if r := rep.Ratios["CPU_B/A2"]; r.Rounds != nil || r.Value != 1.95 {
		t.Errorf("CPU_B/A2 with a round unmeasured = %+v, want 1.95 and no rounds", r)
	}
	// The text report shows the spread and the count.
	var buf strings.Builder
	rep.WriteText(&buf)
	for _, want := range []string{"B/A2_throughput      0.65  (rounds 0.40 to 0.70)", "rounds alone: 2 of 3 met it"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestRoundStat: one round's figure is what its bursts added to the counters, not the
// figure so far.
func TestRoundStat(t *testing.T) {
	f := &figure{Figure: &Figure{Key: "B"}, cpu: &cpuMeter{}}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// Round one: slow samples, 100 ops in 1 s, 10 ms of CPU.
	m := f.mark()
	f.lat = append(f.lat, ms(9), ms(10), ms(11))
	f.ops, f.elapsed = 100, time.Second
	f.cpu.add(ms(8), ms(2), 100)
	one := f.since(m)
	// Round two: fast samples, 300 ops in 1 s, 6 ms of CPU.
	m = f.mark()
	f.lat = append(f.lat, ms(1), ms(2), ms(3))
	f.ops, f.elapsed = 400, 2*time.Second
	f.cpu.add(ms(5), ms(1), 300)
	two := f.since(m)
	if one.p50 != ms(10) || one.ops != 100 || one.cpu != 100 {
		t.Errorf("round one = %+v, want p50 10ms, 100 ops/s, 100 µs/op", one)
	}
	if two.p50 != ms(2) || two.ops != 300 || two.cpu != 20 {
		t.Errorf("round two = %+v, want p50 2ms, 300 ops/s, 20 µs/op", two)
	}
	if !slices.Equal(f.lat, []time.Duration{ms(9), ms(10), ms(11), ms(1), ms(2), ms(3)}) {
		t.Errorf("since reordered the figure's samples: %v", f.lat)
	}
	// Without a CPU meter, or with one that failed, a round's CPU is not a number.
	g := &figure{Figure: &Figure{Key: "R"}}
	m = g.mark()
	g.lat, g.ops, g.elapsed = []time.Duration{ms(1)}, 10, time.Second
	if st := g.since(m); !math.IsNaN(st.cpu) || st.ops != 10 {
		t.Errorf("round without a meter = %+v, want NaN CPU and 10 ops/s", st)
	}
}

// TestJobsTargetCeiling checks the J_redis target and its ceiling from A2's CPU per op:
// ncpu / (5 × A2's CPU), said in the note, and the note says when the target is above it.
func TestJobsTargetCeiling(t *testing.T) {
	cpu := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name       string
		jobsPerSec float64
		a2CPU      *float64
		ncpu       int
		met        bool
		ceiling    float64 // 0: none
		noteHas    string
		noteHasNot string
	}{
		{"below a ceiling under the target", 450, cpu(250), 2, false, 1600, "no rail of this design meets it here", ""},
		{"a bigger machine lifts the ceiling over the target", 2000, cpu(250), 8, true, 6400, "8 CPUs / (5 hops × A2's 250.0 µs per op)", "no rail"},
		{"A2 without its CPU figure", 450, nil, 2, false, 0, "ceiling not computed: CPU per operation not measured for A2", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := &Report{Machine: Machine{NumCPU: c.ncpu}, Ratios: map[string]*Ratio{}, Figures: map[string]*Figure{
				"A2":      {Key: "A2", p50: time.Millisecond, LatencySamples: 10, OpsPerSec: 1, CPUUs: c.a2CPU},
				"J_redis": {Key: "J_redis", p50: 5 * time.Millisecond, LatencySamples: 10, OpsPerSec: c.jobsPerSec},
			}}
			rep.ratiosAndTargets()
			var got *Target
			for i := range rep.Targets {
				if rep.Targets[i].Name == "J_redis jobs/s" {
					got = &rep.Targets[i]
				}
			}
			if got == nil {
				t.Fatalf("no J_redis target in %+v", rep.Targets)
			}
			if got.Met != c.met || got.Value != c.jobsPerSec {
				t.Errorf("met=%v value=%v, want %v %v", got.Met, got.Value, c.met, c.jobsPerSec)
			}
			switch {
			case c.ceiling == 0 && got.Ceiling != nil:
				t.Errorf("ceiling %v, want none", *got.Ceiling)
			case c.ceiling != 0 && (got.Ceiling == nil || *got.Ceiling != c.ceiling):
				t.Errorf("ceiling %v, want %v", got.Ceiling, c.ceiling)
			}
			if !strings.Contains(got.Note, c.noteHas) || (c.noteHasNot != "" && strings.Contains(got.Note, c.noteHasNot)) {
				t.Errorf("note %q: want it to hold %q and not %q", got.Note, c.noteHas, c.noteHasNot)
			}
		})
	}
}

// TestJobsTargetOwnCeiling: with J_redis's CPU per job measured, the J_redis target's note
// also says what the machine's CPUs allow at that cost; without it, the note does not pretend to.
func TestJobsTargetOwnCeiling(t *testing.T) {
	cpu := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name    string
		jCPU    *float64
		ncpu    int
		noteHas string // "" : no own-ceiling clause
	}{
		{"measured", cpu(5000), 2, "at J_redis's own CPU per job (5000 µs, process + Redis) 2 CPUs allow 400 jobs/s"},
		{"measured, four CPUs", cpu(2500), 4, "(2500 µs, process + Redis) 4 CPUs allow 1600 jobs/s"},
		{"not measured", nil, 2, ""},
		{"zero", cpu(0), 2, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := &Report{Machine: Machine{NumCPU: c.ncpu}, Ratios: map[string]*Ratio{}, Figures: map[string]*Figure{
				"A2":      {Key: "A2", p50: time.Millisecond, LatencySamples: 10, OpsPerSec: 1, CPUUs: cpu(250)},
				"J_redis": {Key: "J_redis", p50: 5 * time.Millisecond, LatencySamples: 10, OpsPerSec: 300, CPUUs: c.jCPU},
			}}
			rep.ratiosAndTargets()
			note := rep.Targets[len(rep.Targets)-1].Note
			if c.noteHas == "" && strings.Contains(note, "own CPU") {
				t.Errorf("note %q claims an own-CPU ceiling without the figure's CPU", note)
			}
			if c.noteHas != "" && !strings.Contains(note, c.noteHas) {
				t.Errorf("note %q; want it to hold %q", note, c.noteHas)
			}
		})
	}
	for _, f := range []*Figure{{Key: "J_redis", CPUUs: cpu(5000), Skipped: "no Redis"}, {Key: "J_redis", CPUUs: cpu(5000), Error: "boom"}} {
		if got := ownCeiling(f, 2); got != 0 {
			t.Errorf("ownCeiling of a skipped or failed figure (%+v) = %v, want 0", f, got)
		}
	}
}

// TestMeteredBurstProcessOnly: a figure metered process-only (J_bolt) counts none of Redis's
// CPU even when handed the run's Redis client while Redis is busy; one metered with Redis
// counts it.
func TestMeteredBurstProcessOnly(t *testing.T) {
	ctx := context.Background()
	rdb, err := newRedis(ctx, testRedis(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	spin := func(ctx context.Context, _ int) error { // ~1 ms of Redis CPU
		return rdb.Eval(ctx, "for i = 1, 100000 do end return 0", nil).Err()
	}
	for _, procOnly := range []bool{false, true} {
		f := &figure{Figure: &Figure{Key: "X"}, conc: 2, op: spin, cpu: &cpuMeter{procOnly: procOnly}}
		if err := f.meteredThroughputBurst(ctx, 20*time.Millisecond, rdb); err != nil {
			t.Fatal(err)
		}
		if procOnly && f.cpu.redis != 0 || !procOnly && f.cpu.redis <= 0 || f.cpu.err != nil {
			t.Errorf("procOnly %v: Redis CPU %v over %d ops (err %v); want none only when process-only", procOnly, f.cpu.redis, f.cpu.ops, f.cpu.err)
		}
	}
}

// TestWriteTextProcessOnlyCPU: a figure metered without Redis (J_bolt) prints its CPU as the
// process's, not a Redis share it never had.
func TestWriteTextProcessOnlyCPU(t *testing.T) {
	cpu := func(v float64) *float64 { return &v }
	rep := &Report{Ratios: map[string]*Ratio{}, order: []string{"J_bolt", "B"}, Figures: map[string]*Figure{
		"J_bolt": {Key: "J_bolt", What: "job", p50: time.Millisecond, OpsPerSec: 300, CPUProcessUs: cpu(4500), CPUUs: cpu(4500)},
		"B":      {Key: "B", What: "hop", p50: time.Millisecond, OpsPerSec: 2000, CPUProcessUs: cpu(600), CPURedisUs: cpu(200), CPUUs: cpu(800)},
	}}
	var b strings.Builder
	rep.WriteText(&b)
	out := b.String()
	for _, want := range []string{"[CPU/op 4500.0µs, the process's: no Redis]", "[CPU/op 800.0µs = process 600.0 + Redis 200.0]"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}

// TestFloorFigures runs A2 and R_floor against a real Redis: A2 admits, debits and saves;
// the same stage again is refused (the claim holds); R_floor refuses the goal-less package.
func TestFloorFigures(t *testing.T) {
	ctx := context.Background()
	addr := testRedis(t)
	hr, err := newHopRig(ctx, hopConfig{Store: StoreRedis, RedisAddr: addr, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hr.close)
	shape, err := hr.captureShape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if shape.schema == "" {
		t.Fatalf("B's shape lacks the ack's schema: %+v", shape)
	}
	val, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	fr, err := newFloorRig(ctx, addr, 2, val, shape)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fr.close)
	for i := range 4 {
		if err := fr.hop(ctx, i); err != nil {
			t.Fatalf("A2 hop %d: %v", i, err)
		}
		if err := fr.rejected(ctx, i); err != nil {
			t.Fatalf("R_floor %d: %v", i, err)
		}
	}
	w, err := fr.st.Wallet(ctx, fr.workers[0].walletID)
	if err != nil {
		t.Fatal(err)
	}
	if spent := uint32(0xFFFFFFFF) - w.GetHopsRemaining(); spent != 2 {
		t.Errorf("worker 0's wallet paid %d hops, want 2", spent)
	}
	if got, err := fr.st.GetRun(ctx, fr.workers[0].run.GetRunId()); err != nil || got.GetHops() != 2 {
		t.Errorf("worker 0's run: %d hops saved (%v), want 2", got.GetHops(), err)
	}
	// A repeat of a stage the floor admitted is refused by the claim, as the runner's is.
	p := fr.tmpl.make(fr.jobPrefix, newTraceparent(nil), fr.workers[0].walletID)
	p.Stage = benchStage + "-1"
	if ack, _, err := rpc.Deliver(ctx, fr.client, &handoffv1.DeliverRequest{Package: p, Agent: benchStage}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a repeated stage: ack %v, error %v; want FailedPrecondition from the held claim", ack.GetStatus(), err)
	}
	// Without Redis the floor serves R_floor only.
	bare, err := newFloorRig(ctx, "", 1, val, hopShape{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bare.close)
	if err := bare.rejected(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := bare.hop(ctx, 0); err == nil {
		t.Error("A2 ran without Redis")
	}
}

// TestHopWritesNoWarning: B's and R's client sends each hop on its package's trace, as the
// coordinator does, so the runner logs nothing at warn for a valid hop (a client on a trace
// of its own made every hop log a trace mismatch, which the platform's hops do not pay).
func TestHopWritesNoWarning(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := newHopRig(context.Background(), hopConfig{Store: StoreBolt, BaseDir: t.TempDir(), Workers: 1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	for range 3 {
		if err := r.hop(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(buf.String(), "trace mismatch") {
		t.Fatalf("valid hops logged a trace mismatch:\n%s", buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestRoutesJob: figure J_routes' job completes through five declared routes; the rail
// moved it along each (an undeclared or missing route would have escalated it).
func TestRoutesJob(t *testing.T) {
	r, err := newJobsRigFor(context.Background(), RoutesPipeline, StoreBolt, "", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	for range 2 {
		if err := r.job(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNewBenchmarksRun is a smoke test of the Go benchmarks of issue 22's figures: each runs
// a few iterations without failing (testing.Benchmark reports N == 0 for a benchmark that
// failed or skipped).
func TestNewBenchmarksRun(t *testing.T) {
	bt := flag.Lookup("test.benchtime")
	if bt == nil {
		t.Fatal("no -test.benchtime flag")
	}
	old := bt.Value.String()
	if err := bt.Value.Set("3x"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bt.Value.Set(old) })
	redis := RedisReachable(context.Background(), DefaultRedisAddr) == nil
	if !redis && os.Getenv("CI") != "" {
		t.Fatalf("no Redis at %s under CI", DefaultRedisAddr)
	}
	for _, bm := range []struct {
		name       string
		fn         func(*testing.B)
		needsRedis bool
	}{
		{"FloorHop (A2)", BenchmarkFloorHop, true},
		{"RejectedFloor (R_floor)", BenchmarkRejectedFloor, false},
		{"JobRoutes (J_routes)", BenchmarkJobRoutes, false},
		{"JobTriage (J_triage)", BenchmarkJobTriage, false},
	} {
		if bm.needsRedis && !redis {
			t.Logf("%s skipped: no Redis at %s", bm.name, DefaultRedisAddr)
			continue
		}
		if r := testing.Benchmark(bm.fn); r.N == 0 {
			t.Errorf("benchmark %s did not run (failed or skipped)", bm.name)
		}
	}
}

// TestTriageJob: figure J_triage's job goes through support-triage's billing route to one
// write, twice (two jobs, two ledger entries).
func TestTriageJob(t *testing.T) {
	ctx := context.Background()
	r, err := newTriageRig(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	for range 2 {
		if err := r.job(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if writes, err := r.st.Store.LedgerEntries(ctx); err != nil || len(writes) != 2 {
		t.Fatalf("ledger: %d entries (%v), want 2", len(writes), err)
	}
}

// TestRatiosPerRoundEdges: one round alone is no spread (it is Value), and a round whose
// divisor is zero leaves the ratio without rounds rather than with an Inf json.Marshal
// refuses.
func TestRatiosPerRoundEdges(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	fig := func(key string, p50 time.Duration, ops float64, rounds ...stat) *Figure {
		return &Figure{Key: key, p50: p50, P50us: micros(p50), OpsPerSec: ops, LatencySamples: 10, rounds: rounds}
	}
	nan := math.NaN()
	rep := &Report{Figures: map[string]*Figure{
		// One round each: no rounds.
		"B":  fig("B", us(420), 2600, stat{us(420), 2600, nan}),
		"A2": fig("A2", us(300), 4000, stat{us(300), 4000, nan}),
		// R_floor's second round has a zero p50: R/R_floor_p50 gets no rounds.
		"R":       fig("R", us(130), 9000, stat{us(130), 9000, nan}, stat{us(120), 9500, nan}),
		"R_floor": fig("R_floor", us(100), 10000, stat{us(100), 10000, nan}, stat{0, 10000, nan}),
	}, Ratios: map[string]*Ratio{}}
	rep.ratiosAndTargets()
	for _, k := range []string{"B/A2_p50", "B/A2_throughput", "R/R_floor_p50"} {
		if r := rep.Ratios[k]; r == nil || r.Skipped != "" || r.Rounds != nil {
			t.Errorf("%s = %+v, want a value and no rounds", k, r)
		}
	}
	if r := rep.Ratios["R/R_floor_throughput"]; r == nil || !slices.Equal(r.Rounds, []float64{0.9, 0.95}) {
		t.Errorf("R/R_floor_throughput = %+v, want rounds [0.9 0.95]", r)
	}
	for _, tg := range rep.Targets {
		if tg.RoundsMet != nil || tg.Rounds != 0 {
			t.Errorf("target %q = %+v, want no round count", tg.Name, tg)
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Errorf("json.Marshal: %v", err)
	}
}

// TestRoundKeepsEachRound: round measures a serial and a concurrent burst and keeps what
// that round alone saw: a round of slow calls and one of fast calls keep their own p50s and
// counts, not the mix.
func TestRoundKeepsEachRound(t *testing.T) {
	const slow = 5 * time.Millisecond
	var sleep atomic.Bool
	sleep.Store(true)
	f := &figure{Figure: &Figure{Key: "X"}, conc: 4, cpu: &cpuMeter{}, op: func(context.Context, int) error {
		if sleep.Load() {
			time.Sleep(slow)
		}
		return nil
	}}
	ctx := context.Background()
	if err := f.round(ctx, 20*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	sleep.Store(false)
	if err := f.round(ctx, 20*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if len(f.rounds) != 2 {
		t.Fatalf("rounds = %d, want 2", len(f.rounds))
	}
	one, two := f.rounds[0], f.rounds[1]
	if one.p50 < slow || two.p50 >= slow {
		t.Errorf("p50 round one %v (want >= %v), round two %v (want < %v)", one.p50, slow, two.p50, slow)
	}
	// At most conc calls of 5 ms each finish per 5 ms in round one; round two's are free.
	if one.ops <= 0 || one.ops > 4/slow.Seconds()*1.01 || two.ops <= 10*one.ops {
		t.Errorf("ops/s round one %.0f (want (0, %.0f]), round two %.0f (want > 10 × round one)", one.ops, 4/slow.Seconds(), two.ops)
	}
	if math.IsNaN(one.cpu) || math.IsNaN(two.cpu) {
		t.Errorf("metered rounds without CPU per op: %+v %+v", one, two)
	}
	// A failing call ends the round with its error and keeps no round.
	f.op = func(context.Context, int) error { return errors.New("boom") }
	if err := f.round(ctx, time.Millisecond, nil); err == nil || err.Error() != "boom" || len(f.rounds) != 2 {
		t.Errorf("failing round: err %v, rounds %d; want boom and still 2", err, len(f.rounds))
	}
}

// TestCheckOnly: --only takes figure keys, and refuses anything else naming it.
func TestCheckOnly(t *testing.T) {
	for _, c := range []struct {
		only  []string
		tmpfs bool
		want  string // "" = accepted
	}{
		{nil, false, ""},
		{[]string{"A2", "B", "J_bolt"}, false, ""},
		{[]string{"C_tmpfs"}, true, ""},
		{[]string{"A2", "b"}, false, `--only names "b", which is not a figure`},
		{[]string{"A2", ""}, false, "--only has an empty figure name"},
		{[]string{"C_tmpfs"}, false, "C_tmpfs, which is measured only with --tmpfs-bolt"},
	} {
		err := CheckOnly(c.only, c.tmpfs)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("CheckOnly(%q, %v) = %v, want accepted", c.only, c.tmpfs, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("CheckOnly(%q, %v) = %v, want an error holding %q", c.only, c.tmpfs, err, c.want)
		}
	}
	// Run refuses the same before it starts anything.
	if rep, err := Run(context.Background(), Config{Only: []string{"nope"}}); err == nil || rep != nil {
		t.Errorf("Run with --only nope = %v, %v; want no report and an error", rep, err)
	}
}
