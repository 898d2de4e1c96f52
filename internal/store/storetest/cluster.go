package storetest

// A real local Redis Cluster for the store's tests: three masters and three replicas, each a
// redis-server on a free loopback port (and that port + 10000, its cluster bus), joined by
// `redis-cli --cluster create`. One cluster serves a whole test binary (starting it takes a
// second or two); the package's TestMain stops it (StopCluster). Tests share it as they
// share the single Redis: each under its own key prefix, deleting only its own keys.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/store"
)

var cluster struct {
	once  sync.Once
	addrs []string
	err   error
	dir   string
	procs []*exec.Cmd
}

// ClusterAddrs returns the node addresses of the test cluster, starting it on first use.
// When it cannot start (no redis-server or redis-cli, or the cluster does not form): t.Fatal
// under CI (env CI non-empty), else t.Skip.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	cluster.once.Do(func() { cluster.addrs, cluster.err = startCluster() })
	if cluster.err != nil {
		msg := fmt.Sprintf("no local Redis Cluster: %v (needs redis-server and redis-cli on PATH)", cluster.err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return cluster.addrs
}

// ClusterClient returns a raw client on the test cluster (retries off), closed when t ends.
func ClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// ClusterPrefix returns a key prefix unique to t (as RedisPrefix's), whose keys, and only
// those, are deleted from every master of the test cluster when t ends.
func ClusterPrefix(t testing.TB) string {
	t.Helper()
	rdb := ClusterClient(t)
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "handofftest:" + sanitize(t.Name()) + ":" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			iter := m.Scan(ctx, 0, globEscape(prefix)+"*", 1000).Iterator()
			for iter.Next(ctx) {
				if k := iter.Val(); strings.HasPrefix(k, prefix) { // never another test's keys
					if err := m.Del(ctx, k).Err(); err != nil {
						return err
					}
				}
			}
			return iter.Err()
		})
		if err != nil {
			t.Errorf("cleanup %s*: %v", prefix, err)
		}
	})
	return prefix
}

// OpenCluster opens a store on the test cluster under ClusterPrefix(t), closed when t ends.
func OpenCluster(t testing.TB) *store.Redis {
	t.Helper()
	prefix := ClusterPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := store.OpenRedis(ctx, store.RedisOptions{Cluster: ClusterAddrs(t), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// StopCluster stops the test cluster if it was started and removes its files. For TestMain,
// after m.Run.
func StopCluster() {
	for _, p := range cluster.procs {
		p.Process.Kill()
		p.Wait()
	}
	cluster.procs = nil
	if cluster.dir != "" {
		os.RemoveAll(cluster.dir)
	}
}

func startCluster() (addrs []string, err error) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	if cluster.dir, err = os.MkdirTemp("", "handoff-cluster-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			StopCluster()
		}
	}()
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		ps := strconv.Itoa(p)
		cmd := exec.Command(server, "--port", ps, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+ps+".conf",
			"--cluster-node-timeout", "2000", "--dir", cluster.dir, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1")
		log, err := os.Create(filepath.Join(cluster.dir, "redis-"+ps+".log"))
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server on port %d: %w", p, err)
		}
		cluster.procs = append(cluster.procs, cmd)
		addrs = append(addrs, "127.0.0.1:"+ps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range addrs {
		if err := waitFor(ctx, a, func(c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
			return nil, fmt.Errorf("redis-server %s: %w (logs in %s)", a, err, cluster.dir)
		}
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	// Every node must agree the cluster is whole, all 16384 slots served, before tests use it.
	for _, a := range addrs {
		err := waitFor(ctx, a, func(c *redis.Client) error {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				return errors.New("cluster_state not ok yet")
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("cluster at %s: %w", a, err)
		}
	}
	return addrs, nil
}

// waitFor retries check on a client of addr until it passes or ctx ends.
func waitFor(ctx context.Context, addr string, check func(*redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	for {
		err := check(c)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePorts finds n loopback ports that are free, each with its cluster bus port (+10000)
// free too. (Free when asked: another process may take one before the server binds it, in
// which case the server fails to start and the cluster is reported as not starting.)
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 200 {
			return nil, errors.New("no free loopback ports")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		if seen[p] || seen[p+10000] {
			continue
		}
		seen[p], seen[p+10000] = true, true
		ports = append(ports, p)
	}
	return ports, nil
}
