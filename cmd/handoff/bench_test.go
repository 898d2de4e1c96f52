package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/bench"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestBenchJSON runs `handoff bench --duration 200ms --json` (with J's throughput bursts at
// 4 jobs in flight, so the bbolt drain stays short) and checks that every figure is there,
// measured or skipped with a reason, with the ratios and targets.
func TestBenchJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"bench", "--duration", "200ms", "--json", "--jobs-concurrency", "4", "--bolt-dir", t.TempDir()}, nil, &out, &errb)
	var rep struct {
		Figures map[string]struct {
			P50us          float64  `json:"p50_us"`
			OpsPerSec      float64  `json:"ops_per_sec"`
			LatencySamples int      `json:"latency_samples"`
			AgentCalls     *int64   `json:"agent_calls"`
			CPUUs          *float64 `json:"cpu_us_per_op"`
			CPURedisUs     *float64 `json:"cpu_redis_us_per_op"`
			Skipped, Error string
		} `json:"figures"`
		Ratios  map[string]json.RawMessage `json:"ratios"`
		Targets []bench.Target             `json:"targets"`
		Machine bench.Machine              `json:"machine"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, not JSON: %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
	}
	redisDown := bench.RedisReachable(context.Background(), bench.DefaultRedisAddr) != nil
	for _, k := range bench.FigureKeys {
		f, ok := rep.Figures[k]
		switch {
		case !ok:
			t.Errorf("figure %s is missing", k)
		case f.Skipped != "":
			if !redisDown {
				t.Errorf("figure %s skipped (%s) with Redis up", k, f.Skipped)
			}
		case f.Error != "" || f.LatencySamples == 0 || f.P50us <= 0 || f.OpsPerSec <= 0:
			t.Errorf("figure %s: error %q, %d samples, p50 %v µs, %v ops/s", k, f.Error, f.LatencySamples, f.P50us, f.OpsPerSec)
		}
	}
	if r := rep.Figures["R"]; r.Skipped == "" && (r.AgentCalls == nil || *r.AgentCalls != 0) {
		t.Errorf("R made agent calls: %v", r.AgentCalls)
	}
	for _, k := range []string{"B/A2_p50", "B/A2_throughput", "CPU_B/A2", "R/R_floor_p50", "R/R_floor_throughput", "B/A_p50", "C/A_p50", "B/A_throughput", "R/echo_p50"} {
		if _, ok := rep.Ratios[k]; !ok {
			t.Errorf("ratio %s is missing", k)
		}
	}
	if len(rep.Targets) != 7 || rep.Machine.NumCPU == 0 || rep.Machine.Go == "" {
		t.Errorf("targets %d (want 7), machine %+v", len(rep.Targets), rep.Machine)
	}
	// With A2 measured, the J_redis target carries the machine's ceiling at A2's CPU.
	for _, tg := range rep.Targets {
		if tg.Name == "J_redis jobs/s" && rep.Figures["A2"].Skipped == "" && rep.Figures["J_redis"].Skipped == "" && (tg.Ceiling == nil || *tg.Ceiling <= 0) {
			t.Errorf("J_redis target without a ceiling: %+v", tg)
		}
	}
	// A, A2, B and the two J figures carry the CPU per operation of their throughput
	// bursts; J_bolt, which uses no Redis, no Redis share.
	for _, k := range []string{"A", "A2", "B", "J_redis", "J_bolt"} {
		if f := rep.Figures[k]; f.Skipped == "" && (f.CPUUs == nil || *f.CPUUs <= 0) {
			t.Errorf("figure %s: CPU per operation %v, want > 0", k, f.CPUUs)
		}
	}
	if f := rep.Figures["J_bolt"]; f.CPURedisUs != nil {
		t.Errorf("J_bolt: Redis CPU %v per job, want none reported (it uses no Redis)", *f.CPURedisUs)
	}
	if f := rep.Figures["J_redis"]; f.Skipped == "" && f.CPURedisUs == nil {
		t.Error("J_redis: no Redis CPU per job reported")
	}
}

// TestBenchShardsUsage: --shards and --cluster refuse bad values before anything runs.
func TestBenchShardsUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--shards", "-1"}, "--shards must not be negative, got -1"},
		{[]string{"bench", "--cluster", "127.0.0.1:7000"}, "--cluster needs --shards"},
		{[]string{"bench", "--only", "A2,Bee"}, `--only names "Bee", which is not a figure`},
		{[]string{"bench", "--only", "A2,"}, "--only has an empty figure name"},
		{[]string{"bench", "--only="}, "--only has an empty figure name"}, // not the full suite
		{[]string{"bench", "--only", " "}, "--only has an empty figure name"},
		{[]string{"bench", "--only", "C_tmpfs"}, "measured only with --tmpfs-bolt"},
		{[]string{"bench", "--only", "A2", "--shards", "10"}, "--only does not apply to --shards"},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, errb.String(), c.want)
		}
	}
}

// TestBenchOnly: `--only` measures the figures named and reports every other one skipped
// as not selected and unmeasured; a rig started for a named figure says so (A2 takes its
// shape from B's rig, A runs on echo's bare server), and a ratio on a skipped figure is
// skipped naming it. `--only A` names A alone, not A2 (its prefix).
func TestBenchOnly(t *testing.T) {
	storetest.RedisClient(t) // A and A2 run on Redis: fails under CI without it, skips otherwise
	for _, c := range []struct {
		only       string
		measured   []string
		startedFor map[string]string // figure → the named figure its rig was started for
		skipped    string            // a ratio that must be skipped, naming its missing figure
	}{
		{"A2, R_floor", []string{"A2", "R_floor"}, map[string]string{"B": "A2"}, "B/A2_p50"},
		{"A", []string{"A"}, map[string]string{"echo": "A"}, "B/A_p50"},
	} {
		t.Run(c.only, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run([]string{"bench", "--duration", "100ms", "--json", "--only", c.only, "--bolt-dir", t.TempDir()}, nil, &out, &errb)
			if code != 0 {
				t.Fatalf("exit %d: %s\n%s", code, errb.String(), out.String())
			}
			var rep bench.Report
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out.String())
			}
			for _, k := range bench.FigureKeys {
				f := rep.Figures[k]
				switch {
				case f == nil:
					t.Errorf("figure %s is missing", k)
				case slices.Contains(c.measured, k):
					if f.Skipped != "" || f.Error != "" || f.LatencySamples == 0 || f.OpsPerSec <= 0 {
						t.Errorf("figure %s: skipped %q, error %q, %d samples, %v ops/s; want it measured", k, f.Skipped, f.Error, f.LatencySamples, f.OpsPerSec)
					}
				case c.startedFor[k] != "":
					if want := "not selected (--only); its rig was started for " + c.startedFor[k]; f.Skipped != want || f.LatencySamples != 0 {
						t.Errorf("figure %s: skipped %q, %d samples; want %q and unmeasured", k, f.Skipped, f.LatencySamples, want)
					}
				case f.Skipped != "not selected (--only)" || f.LatencySamples != 0:
					t.Errorf("figure %s: skipped %q, %d samples; want not selected and unmeasured", k, f.Skipped, f.LatencySamples)
				}
			}
			if r := rep.Ratios[c.skipped]; r == nil || !strings.Contains(r.Skipped, "B skipped") {
				t.Errorf("%s = %+v, want skipped naming B", c.skipped, r)
			}
		})
	}
}
