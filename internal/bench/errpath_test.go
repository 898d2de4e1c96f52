package bench

import (
	"context"
	"testing"
)

// TestSetupFailuresClean: a rig whose setup fails returns an error and cleans up after
// itself (no panic on a half-built rig).
func TestSetupFailuresClean(t *testing.T) {
	ctx := context.Background()
	if _, err := newHopRig(ctx, hopConfig{Store: "etcd"}); err == nil {
		t.Error("unknown store: want an error")
	}
	if _, err := newHopRig(ctx, hopConfig{Store: StoreRedis, RedisAddr: "127.0.0.1:1"}); err == nil {
		t.Error("unreachable Redis: want an error")
	}
	if _, err := newJobsRig(ctx, StoreRedis, "127.0.0.1:1", "", nil); err == nil {
		t.Error("unreachable Redis: want an error")
	}
	if _, err := newBareRig(ctx, "127.0.0.1:1", 1); err == nil {
		t.Error("unreachable Redis: want an error")
	}
}
