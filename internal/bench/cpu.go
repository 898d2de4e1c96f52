package bench

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/bench/peer"
)

// processCPU is the CPU time (user + system) this process has used: every server and
// client of the figures runs in it.
func processCPU() time.Duration {
	cpu, err := peer.Self()()
	if err != nil {
		return 0
	}
	return cpu
}

// parseRedisCPU returns used_cpu_sys + used_cpu_user from the text of Redis's INFO cpu:
// the CPU the Redis server has used, all its clients together.
func parseRedisCPU(info string) (time.Duration, error) {
	var sum float64
	seen := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, fmt.Errorf("redis INFO cpu: %s is %q, want seconds", k, v)
		}
		sum += f
		seen++
	}
	if seen != 2 {
		return 0, fmt.Errorf("redis INFO cpu: want used_cpu_sys and used_cpu_user, found %d of them", seen)
	}
	return time.Duration(sum * float64(time.Second)), nil
}

// redisCPU reads the Redis server's CPU time.
func redisCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	return parseRedisCPU(info)
}

// cpuMeter adds up, over a figure's throughput bursts, the CPU the process and Redis
// used, for the CPU per operation.
type cpuMeter struct {
	proc, redis time.Duration
	ops         int
	err         error
	// procOnly: the figure does not use Redis (J_bolt), so Redis's CPU is neither read nor
	// reported, and whatever else runs on that Redis does not count against it.
	procOnly bool
}

// add counts one burst: the CPU deltas it saw and its operations.
func (m *cpuMeter) add(proc, redis time.Duration, ops int) {
	m.proc += max(proc, 0)
	m.redis += max(redis, 0)
	m.ops += ops
}

// perOp returns the process's, Redis's and their sum's CPU microseconds per operation;
// ok is false when there were no operations.
func (m *cpuMeter) perOp() (proc, redis, total float64, ok bool) {
	if m.ops <= 0 {
		return 0, 0, 0, false
	}
	us := func(d time.Duration) float64 {
		return peer.Round2(float64(d) / float64(time.Microsecond) / float64(m.ops))
	}
	return us(m.proc), us(m.redis), us(m.proc + m.redis), true
}
