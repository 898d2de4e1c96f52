package store_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestRedisLeaseFenceFailure: when the fence cannot be taken (the counter is not a number),
// AcquireLeaseFence reports the lease it took with the error and writes no epoch; the
// caller's release then frees the lease and unlists it, on one Redis (one script) as on the
// per-slot steps.
func TestRedisLeaseFenceFailure(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	raw := storetest.RedisClient(t)
	s := storetest.OpenRedisPrefix(t, prefix)
	ctx := context.Background()
	const runID, name = "lff", "run:lff"
	fenceKey := prefix + "{" + runID + "}:fence"
	if err := raw.Set(ctx, fenceKey, "not-a-number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	held, epoch, err := s.AcquireLeaseFence(ctx, name, "owner-a", time.Minute, runID)
	if err == nil || !held || epoch != 0 {
		t.Fatalf("AcquireLeaseFence with a broken fence = %v, %d, %v; want the lease held, no epoch, an error", held, epoch, err)
	}
	if v, _ := raw.Get(ctx, fenceKey).Result(); v != "not-a-number" {
		t.Fatalf("fence after the failed INCR = %q; want it untouched", v)
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	bucket := prefix + "{leases:" + fmt.Sprint(h.Sum32()%16) + "}:index"
	if _, err := raw.ZScore(ctx, bucket, name).Result(); err != nil {
		t.Fatalf("the lease taken is not listed in %s: %v", bucket, err)
	}
	if err := s.ReleaseLease(ctx, name, "owner-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ZScore(ctx, bucket, name).Result(); err != redis.Nil {
		t.Fatalf("the released lease is still listed: %v", err)
	}
	if ok, err := s.AcquireLease(ctx, name, "owner-b", time.Minute); err != nil || !ok {
		t.Fatalf("another owner's AcquireLease after the release = %v, %v; want held", ok, err)
	}
	var _ store.LeaseFencer = s
}
