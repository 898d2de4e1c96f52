package rediscluster_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/rediscluster"
)

// TestKillMasterPromotesReplica: a key written to a cluster survives the SIGKILL of the
// master that held it (replicated before the kill: WAIT), its replica is promoted, and the
// killed node rejoins when restarted.
func TestKillMasterPromotesReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := rediscluster.Start(ctx, rediscluster.Options{Dir: t.TempDir(), NodeTimeout: time.Second})
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("no local Redis Cluster: %v", err)
	}
	defer c.Stop()
	// go-redis reloads the slot map on MOVED, or when it is older than this (default 60s):
	// a dead master's slots answer nothing, so only the age brings the new master in.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClusterStateReloadInterval: time.Second})
	defer rdb.Close()
	masters, err := c.Masters(ctx)
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters = %v, %v; want 3", masters, err)
	}
	m, err := rdb.MasterForKey(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := m.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT = %d, %v; want the replica's ack", n, err)
	}
	victim := m.Options().Addr
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitFailover(ctx, victim); err != nil {
		t.Fatal(err)
	}
	after, err := c.Masters(ctx)
	if err != nil || len(after) != 3 || slices.Contains(after, victim) {
		t.Fatalf("masters after killing %s = %v, %v; want 3 others", victim, after, err)
	}
	var last error
	for {
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		v, err := rdb.Get(gctx, "k").Result()
		gcancel()
		last = err
		if err == nil {
			if v != "v" {
				t.Fatalf("k = %q after the failover", v)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("k unreadable after the failover: %v", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.Restart(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOK(ctx); err != nil {
		t.Fatal(err)
	}
}
