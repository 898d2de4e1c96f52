package rpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/testkit"
)

// TestStreamsBeyondTheWorkers: the server keeps a few goroutines for its streams (4 per
// CPU, at least 64); streams beyond them, while every worker is held by a slow handler, still reach
// their handler at once instead of waiting for a worker.
func TestStreamsBeyondTheWorkers(t *testing.T) {
	r := &holdRunner{release: make(chan struct{})}
	cc := testkit.Dial(t, serveTCP(t, r, rpc.Limits{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	calls := holdAll(t, ctx, cc, r, rpc.StreamWorkers()+5)
	close(r.release)
	for i, c := range calls {
		if err := <-c; err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
