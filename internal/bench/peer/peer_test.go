package peer

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v; want %v", c.in, got, c.want)
		}
	}
}

func TestFigureFinish(t *testing.T) {
	var f Figure
	for _, r := range []struct {
		p50, p99 time.Duration
		jps      float64
	}{{10 * time.Millisecond, 40 * time.Millisecond, 300}, {30 * time.Millisecond, 20 * time.Millisecond, 100}, {20 * time.Millisecond, 30 * time.Millisecond, 200}} {
		f.Add(r.p50, r.p99, r.jps)
	}
	f.Finish()
	if f.P50ms != 20 || f.P99ms != 30 || f.JobsPerSec != 200 || len(f.RoundsP50) != 3 {
		t.Errorf("after 3 rounds: p50 %v p99 %v jobs/s %v rounds %v; want the medians 20, 30, 200 over 3 rounds", f.P50ms, f.P99ms, f.JobsPerSec, f.RoundsP50)
	}
	if f.CPUms != 0 || f.RoundsCPU != nil {
		t.Errorf("no CPU recorded: cpu %v rounds %v; want 0 and none (left out of the JSON)", f.CPUms, f.RoundsCPU)
	}
	for _, d := range []time.Duration{6 * time.Millisecond, 2 * time.Millisecond, 4500 * time.Microsecond} {
		f.AddCPU(d)
	}
	f.Finish()
	if f.CPUms != 4.5 || !slices.Equal(f.RoundsCPU, []float64{6, 2, 4.5}) {
		t.Errorf("CPU per job %v over rounds %v; want the median 4.5 of 6, 2, 4.5", f.CPUms, f.RoundsCPU)
	}
}

// TestCPUCeiling: ncpu CPUs at cpuMs per job; nothing for a figure without CPU.
func TestCPUCeiling(t *testing.T) {
	for _, c := range []struct {
		ncpu  int
		cpuMs float64
		want  float64
	}{
		{2, 4, 500},
		{2, 2.5, 800},
		{1, 0.5, 2000},
		{2, 0, 0},
		{0, 4, 0},
		{2, -1, 0},
		{2, math.NaN(), 0},
		{2, math.Inf(1), 0},
	} {
		if got := CPUCeiling(c.ncpu, c.cpuMs); got != c.want {
			t.Errorf("CPUCeiling(%d, %v) = %v; want %v", c.ncpu, c.cpuMs, got, c.want)
		}
	}
}

func TestTailKeepsTheEnd(t *testing.T) {
	var tl Tail
	tl.Write([]byte(strings.Repeat("a", tailSize)))
	tl.Write([]byte("the error"))
	s := tl.String()
	if len(s) != tailSize || !strings.HasSuffix(s, "the error") {
		t.Errorf("tail of %d bytes ending %q; want %d ending with the last write", len(s), s[len(s)-12:], tailSize)
	}
}

// TestRoundRatios: round i over round i, rounded; nothing when the rounds cannot be paired
// or a value is not positive.
func TestRoundRatios(t *testing.T) {
	for _, c := range []struct {
		name     string
		num, den []float64
		want     []float64
	}{
		{"paired", []float64{700, 910, 540}, []float64{104, 119, 91}, []float64{6.73, 7.65, 5.93}},
		{"one round", []float64{700}, []float64{100}, nil},
		{"unequal", []float64{700, 800}, []float64{100, 100, 100}, nil},
		{"a zero", []float64{700, 0}, []float64{100, 100}, nil},
		{"a NaN", []float64{700, math.NaN()}, []float64{100, 100}, nil},
		{"an Inf", []float64{700, math.Inf(1)}, []float64{100, 100}, nil},
	} {
		if got := RoundRatios(c.num, c.den); !slices.Equal(got, c.want) {
			t.Errorf("%s: RoundRatios = %v, want %v", c.name, got, c.want)
		}
	}
	if n := Count([]float64{5.9, 10, 12}, func(v float64) bool { return v >= 10 }); n != 2 {
		t.Errorf("Count = %d, want 2", n)
	}
}

// Judge: the ratio against its target, and the rounds that met it; without rounds, no
// count (nil, left out of the JSON), never a count of 0 that reads as "no round met it".
func TestJudge(t *testing.T) {
	atLeast10 := func(v float64) bool { return v >= 10 }
	met, n := Judge(10, []float64{9.9, 10, 12}, atLeast10)
	if met == nil || !*met || n == nil || *n != 2 {
		t.Errorf("Judge(10, rounds 9.9 10 12) = %v, %v; want met, 2 rounds", met, n)
	}
	met, n = Judge(9.99, nil, atLeast10)
	if met == nil || *met || n != nil {
		t.Errorf("Judge(9.99, no rounds) = %v, %v; want missed, no count", met, n)
	}
}

// Over: a ratio of two finite positive values, else 0 (never NaN or Inf).
func TestOver(t *testing.T) {
	for _, c := range []struct {
		num, den, want float64
	}{
		{700, 100, 7},
		{700, 0, 0},
		{0, 100, 0},
		{-1, 100, 0},
		{math.NaN(), 100, 0},
		{700, math.NaN(), 0},
		{math.Inf(1), 100, 0},
		{700, math.Inf(1), 0},
	} {
		if got := Over(c.num, c.den); got != c.want {
			t.Errorf("Over(%v, %v) = %v, want %v", c.num, c.den, got, c.want)
		}
	}
}

// TestCeiling: a handoff figure's CPU ceiling, rounded, and over the peer's jobs/s; nothing
// without its CPU per job, and no ratio over a peer without jobs/s. CPUCell prints the CPU.
func TestCeiling(t *testing.T) {
	for _, c := range []struct {
		name       string
		h, p       Figure
		ncpu       int
		jobs, over float64
		cell       string
	}{
		{"measured", Figure{CPUms: 4.5}, Figure{JobsPerSec: 55}, 2, 444, 8.08, "4.50"},
		{"four CPUs", Figure{CPUms: 1.5}, Figure{JobsPerSec: 55}, 4, 2667, 48.48, "1.50"},
		{"peer without jobs/s", Figure{CPUms: 4.5}, Figure{}, 2, 444, 0, "4.50"},
		{"no CPU measured", Figure{}, Figure{JobsPerSec: 55}, 2, 0, 0, "-"},
	} {
		jobs, over := Ceiling(c.ncpu, &c.h, &c.p)
		if jobs != c.jobs || over != c.over || c.h.CPUCell() != c.cell {
			t.Errorf("%s: Ceiling = %v, %v, CPUCell %q; want %v, %v, %q", c.name, jobs, over, c.h.CPUCell(), c.jobs, c.over, c.cell)
		}
	}
}
