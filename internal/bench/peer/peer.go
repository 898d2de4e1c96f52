// Package peer holds what the peer benchmarks (bench/temporal, bench/restate: their own Go
// modules, run beside handoff's J on one machine) share, some of it with `handoff bench`: a
// figure's medians over interleaved rounds, its ratios round by round, the machine's load,
// a free port, and the tail of a server's output.
package peer

import (
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// Header is what a peer benchmark's report says first, as both print it: when and where it
// ran, and the shape of its rounds. Embed it first in the report so its JSON keeps that order.
type Header struct {
	Date        string `json:"date"`
	GoVersion   string `json:"go_version"`
	NumCPU      int    `json:"nproc"`
	Load        string `json:"loadavg_start,omitempty"`
	LoadEnd     string `json:"loadavg_end,omitempty"`
	Jobs        int    `json:"jobs_per_round_concurrent"`
	Serial      int    `json:"jobs_per_round_serial"`
	Concurrency int    `json:"concurrency"`
	Rounds      int    `json:"rounds"`
}

// NewHeader is the Header of a run starting now (LoadEnd is set when it ends).
func NewHeader(jobs, serial, concurrency, rounds int) Header {
	return Header{Date: time.Now().UTC().Format(time.RFC3339), GoVersion: runtime.Version(), NumCPU: runtime.NumCPU(),
		Load: Loadavg(), Jobs: jobs, Serial: serial, Concurrency: concurrency, Rounds: rounds}
}

// Figure is one system's result: medians over the rounds of each round's p50 and p99 (one
// job at a time) and jobs/s (many in flight).
type Figure struct {
	Key        string    `json:"key,omitempty"`
	Name       string    `json:"name"`
	P50ms      float64   `json:"p50_ms"`
	P99ms      float64   `json:"p99_ms"`
	JobsPerSec float64   `json:"jobs_per_sec"`
	RoundsP50  []float64 `json:"rounds_p50_ms"`
	RoundsJPS  []float64 `json:"rounds_jobs_per_sec"`
	// CPU per job in the rounds with many in flight, where measured (handoff's J: bench.
	// JobsResult.CPU), and its median.
	CPUms     float64   `json:"cpu_ms_per_job,omitempty"`
	RoundsCPU []float64 `json:"rounds_cpu_ms_per_job,omitempty"`
	p99s      []float64
}

// Add records one round.
func (f *Figure) Add(p50, p99 time.Duration, jps float64) {
	f.RoundsP50 = append(f.RoundsP50, Ms(p50))
	f.p99s = append(f.p99s, Ms(p99))
	f.RoundsJPS = append(f.RoundsJPS, jps)
}

// AddCPU records one round's CPU per job.
func (f *Figure) AddCPU(perJob time.Duration) { f.RoundsCPU = append(f.RoundsCPU, Ms(perJob)) }

// Finish sets the figure's medians over its rounds.
func (f *Figure) Finish() {
	f.P50ms, f.P99ms, f.JobsPerSec = Median(f.RoundsP50), Median(f.p99s), Median(f.RoundsJPS)
	f.CPUms = Median(f.RoundsCPU)
}

// CPUCeiling is the most jobs per second ncpu CPUs allow at cpuMs of CPU per job, every
// one of them busy and nothing else running: a figure's jobs/s cannot pass it on this
// machine until its CPU per job falls. 0 unless both are finite and positive.
func CPUCeiling(ncpu int, cpuMs float64) float64 { return Over(float64(ncpu)*1000, cpuMs) }

// Ceiling is handoff's figure h's CPUCeiling on ncpu CPUs, rounded to whole jobs/s, and that
// over the peer p's jobs/s (two decimals): both 0 when h's CPU per job was not measured,
// the second also when p has no jobs/s.
func Ceiling(ncpu int, h, p *Figure) (jobsPerSec, overPeer float64) {
	c := CPUCeiling(ncpu, h.CPUms)
	if c == 0 {
		return 0, 0
	}
	return math.Round(c), Round2(Over(c, p.JobsPerSec))
}

// CPUCell is f's CPU per job as a report's table prints it: two decimals, or "-" when not
// measured (a peer's CPU is other processes' too).
func (f *Figure) CPUCell() string {
	if f.CPUms > 0 {
		return fmt.Sprintf("%.2f", f.CPUms)
	}
	return "-"
}

// Median is the median of v (0 for none).
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Ms is d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Round2 rounds f to two decimals.
func Round2(f float64) float64 { return math.Round(f*100) / 100 }

// Over is num / den, or 0 unless both are finite and positive: a ratio over a figure with
// no jobs/s or no p50 (or a NaN or Inf one) is 0, never NaN or Inf, which JSON cannot carry.
func Over(num, den float64) float64 {
	if !(num > 0) || !(den > 0) || math.IsInf(num, 0) || math.IsInf(den, 0) {
		return 0
	}
	return num / den
}

// RoundRatios is num[i] / den[i] for each round, rounded to two places: a ratio as each
// round alone measured it (the peer benches interleave their figures, so round i of each
// ran together). It is nil unless both have the same number of rounds, at least two, and
// every value is finite and positive (Over).
func RoundRatios(num, den []float64) []float64 {
	if len(num) < 2 || len(num) != len(den) {
		return nil
	}
	out := make([]float64, len(num))
	for i := range num {
		v := Over(num[i], den[i])
		if v == 0 {
			return nil
		}
		out[i] = Round2(v)
	}
	return out
}

// Count is how many of v satisfy ok.
func Count(v []float64, ok func(float64) bool) int {
	n := 0
	for _, x := range v {
		if ok(x) {
			n++
		}
	}
	return n
}

// Judge is whether the ratio v meets its target (ok), and how many of its rounds do (nil
// without rounds). Pointers, so that a ratio with no target leaves both out of its JSON.
func Judge(v float64, rounds []float64, ok func(float64) bool) (met *bool, roundsMet *int) {
	m := ok(v)
	if rounds == nil {
		return &m, nil
	}
	n := Count(rounds, ok)
	return &m, &n
}

// Round1 rounds each of v to one decimal.
func Round1(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(int(x*10+0.5)) / 10
	}
	return out
}

// Loadavg is the machine's 1, 5 and 15 minute load averages from /proc/loadavg ("0.95
// 1.34 1.41"), or "" where there is none.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// FreePort returns a loopback port nothing listened on a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailSize is how much of a server's output a Tail keeps.
const tailSize = 4096

// Tail keeps the last 4 KiB written to it: a server's output, for error messages.
type Tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = t.buf[len(t.buf)-tailSize:]
	}
	return len(p), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
