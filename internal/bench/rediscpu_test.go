package bench

import (
	"testing"
	"time"
)

func TestParseCPU(t *testing.T) {
	for _, c := range []struct {
		info string
		want float64
		bad  bool
	}{
		{"# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\n", 3.75, false},
		{"# CPU\r\nused_cpu_sys:1.0\r\n", 0, true},
		{"used_cpu_sys:x\nused_cpu_user:1\n", 0, true},
	} {
		got, err := parseCPU(c.info)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("parseCPU(%q) = %v, %v; want %v (error: %v)", c.info, got, err, c.want, c.bad)
		}
	}
}

// TestShardsFor: the projection is ceil(rate × cpu per job / 0.7 s), and nothing without a
// measured cost.
func TestShardsFor(t *testing.T) {
	side := ShardSide{CPUPerJob: 700 * time.Microsecond} // 1,000 jobs/s per shard at 70%
	for _, c := range []struct {
		rate float64
		want int
	}{{1, 1}, {1000, 1}, {1001, 2}, {10000, 10}} {
		if got := ShardsFor(c.rate, side); got != c.want {
			t.Errorf("ShardsFor(%v) = %d, want %d", c.rate, got, c.want)
		}
	}
	if got := ShardsFor(1000, ShardSide{}); got != 0 {
		t.Errorf("ShardsFor with no cost = %d, want 0", got)
	}
}
