package storetest

// A real local Redis Cluster for the store's tests: three masters and three replicas
// (internal/rediscluster: each a redis-server on a free loopback port, joined by `redis-cli
// --cluster create`). One cluster serves a whole test binary (starting it takes a
// second or two); the package's TestMain stops it (StopCluster). Tests share it as they
// share the single Redis: each under its own key prefix, deleting only its own keys.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/rediscluster"
	"github.com/handoffhq/handoff/internal/store"
)

var cluster struct {
	once  sync.Once
	addrs []string
	err   error
	dir   string
	c     *rediscluster.Cluster
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
	prefix := uniquePrefix(t)
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

// Main is a TestMain for a package whose tests use the local cluster: it runs the tests,
// then stops the cluster they may have started, so no redis-server outlives the test binary.
func Main(m *testing.M) {
	code := m.Run()
	StopCluster()
	os.Exit(code)
}

// StopCluster stops the test cluster if it was started and removes its files. For TestMain,
// after m.Run.
func StopCluster() {
	if cluster.c != nil {
		cluster.c.Stop()
		cluster.c = nil
	}
	if cluster.dir != "" {
		os.RemoveAll(cluster.dir)
	}
}

func startCluster() (addrs []string, err error) {
	if cluster.dir, err = os.MkdirTemp("", "handoff-cluster-"); err != nil {
		return nil, err
	}
	c, err := rediscluster.Start(context.Background(), rediscluster.Options{Dir: cluster.dir})
	if err != nil {
		os.RemoveAll(cluster.dir)
		return nil, err
	}
	cluster.c = c
	return c.Addrs(), nil
}
