package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// RedisCPU is the CPU time (seconds, used_cpu_sys + used_cpu_user of INFO cpu) a Redis
// server has used since it started, summed over the masters of a cluster when rdb is a
// *redis.ClusterClient. The difference of two readings around a run is the server CPU the
// run cost; replicas are left out (they replay the masters' writes, and a shard's capacity
// is its master's one core).
func RedisCPU(ctx context.Context, rdb redis.UniversalClient) (float64, error) {
	read := func(c *redis.Client) (float64, error) {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return 0, err
		}
		return parseCPU(info)
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		total := 0.0
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			v, err := read(c)
			mu.Lock()
			total += v
			mu.Unlock()
			return err
		})
		return total, err
	}
	c, ok := rdb.(*redis.Client)
	if !ok {
		return 0, fmt.Errorf("bench: RedisCPU of a %T", rdb)
	}
	return read(c)
}

// parseCPU adds used_cpu_sys and used_cpu_user of an INFO cpu reply.
func parseCPU(info string) (float64, error) {
	total, seen := 0.0, 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: INFO cpu %s=%q: %w", k, v, err)
		}
		total += f
		seen++
	}
	if seen != 2 {
		return 0, fmt.Errorf("bench: INFO cpu has no used_cpu_sys and used_cpu_user")
	}
	return total, nil
}
