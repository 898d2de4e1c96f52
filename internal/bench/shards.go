package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/rediscluster"
)

// StoreCluster is J's store on a Redis Cluster: the same services on store.OpenRedis with
// RedisOptions.Cluster.
const StoreCluster = "redis-cluster"

// ShardsConfig is RunShards': J on one Redis and J on a Redis Cluster, with the Redis CPU
// each job cost.
type ShardsConfig struct {
	// Jobs per side (after a warm-up job each), Concurrency in flight [200, 32].
	Jobs, Concurrency int
	// RedisAddr is the one Redis; empty starts a redis-server of its own for the run (no
	// persistence, as the cluster's nodes), so no other user of a shared Redis is counted
	// in its CPU.
	RedisAddr string
	// ClusterAddrs are nodes of a Redis Cluster; empty starts a local one (3 masters, 3
	// replicas: internal/rediscluster) for the run.
	ClusterAddrs []string
}

// ShardSide is one side's figures. CPUPerJob is the Redis server CPU (INFO cpu, summed
// over the masters) per job; JobsPerShard is what one shard, a single-threaded master
// holding at most one core, could serve at 70% of that core: 0.7 / CPUPerJob.
type ShardSide struct {
	Jobs         JobsResult
	Masters      int
	CPUPerJob    time.Duration
	JobsPerShard float64
}

// ShardsResult is both sides.
type ShardsResult struct {
	One, Cluster ShardSide
}

// ShardsFor is how many shards a job rate needs at side's CPU per job, each master kept at
// 70% of its core: ceil(rate × CPUPerJob / 0.7 s).
func ShardsFor(rate float64, side ShardSide) int {
	if side.CPUPerJob <= 0 {
		return 0
	}
	return int(math.Ceil(rate * side.CPUPerJob.Seconds() / 0.7))
}

// RunShards measures J on one Redis, then on a Redis Cluster.
func RunShards(ctx context.Context, cfg ShardsConfig) (ShardsResult, error) {
	if cfg.Jobs <= 0 {
		cfg.Jobs = 200
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	var res ShardsResult
	if cfg.RedisAddr == "" {
		addr, stop, err := ownRedis()
		if err != nil {
			return res, err
		}
		defer stop()
		cfg.RedisAddr = addr
	}
	one, err := newRedis(ctx, cfg.RedisAddr)
	if err != nil {
		return res, err
	}
	defer one.Close()
	if res.One, err = measureSide(ctx, cfg, StoreRedis, cfg.RedisAddr, one, 1); err != nil {
		return res, err
	}
	addrs := cfg.ClusterAddrs
	if len(addrs) == 0 {
		dir, err := os.MkdirTemp("", "handoff-bench-cluster-")
		if err != nil {
			return res, err
		}
		defer os.RemoveAll(dir)
		c, err := rediscluster.Start(ctx, rediscluster.Options{Dir: dir})
		if err != nil {
			return res, err
		}
		defer c.Stop()
		addrs = c.Addrs()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1})
	defer cc.Close()
	masters := 0
	if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters++; return nil }); err != nil {
		return res, err
	}
	res.Cluster, err = measureSide(ctx, cfg, StoreCluster, strings.Join(addrs, ","), cc, masters)
	return res, err
}

// measureSide runs J on one store and reads the Redis CPU around it.
func measureSide(ctx context.Context, cfg ShardsConfig, kind, addr string, rdb redis.UniversalClient, masters int) (ShardSide, error) {
	before, err := RedisCPU(ctx, rdb)
	if err != nil {
		return ShardSide{}, err
	}
	j, err := RunJobs(ctx, JobsConfig{N: cfg.Jobs, Concurrency: cfg.Concurrency, Store: kind, RedisAddr: addr})
	if err != nil {
		return ShardSide{}, err
	}
	after, err := RedisCPU(ctx, rdb)
	if err != nil {
		return ShardSide{}, err
	}
	if after < before {
		return ShardSide{}, errors.New("bench: a Redis restarted during the run (its CPU counter went back)")
	}
	// The warm-up job and the prefix cleanup run inside the readings too: a little over
	// Jobs jobs' worth, so the figure errs on the high side.
	per := time.Duration((after - before) / float64(cfg.Jobs) * float64(time.Second))
	side := ShardSide{Jobs: j, Masters: masters, CPUPerJob: per}
	if per > 0 {
		side.JobsPerShard = 0.7 / per.Seconds()
	}
	return side, nil
}

// deleteClusterPrefix removes every key under prefix from each master of the cluster.
func deleteClusterPrefix(ctx context.Context, addrs []string, prefix string) error {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRetries: -1})
	defer cc.Close()
	return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if k := iter.Val(); strings.HasPrefix(k, prefix) {
				if err := m.Del(ctx, k).Err(); err != nil {
					return err
				}
			}
		}
		return iter.Err()
	})
}

// ownRedis starts a redis-server on a free loopback port, without persistence.
func ownRedis() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("bench: start redis-server: %w", err)
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := RedisReachable(ctx, addr)
		cancel()
		if err == nil {
			return addr, stop, nil
		}
		if i > 100 {
			stop()
			return "", nil, fmt.Errorf("bench: own redis-server on %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
