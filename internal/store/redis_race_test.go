package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestRedisSubmitRaceAcrossClients: one request submitted at once through two clients (two
// coordinator replicas on one Redis), each under a run id of its own: one run is created, every
// other call answers with it, and of the submitters racing for its lease and first epoch
// exactly one holds it; a takeover's epoch is above it.
func TestRedisSubmitRaceAcrossClients(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	clients := []*store.Redis{storetest.OpenRedisPrefix(t, prefix), storetest.OpenRedisPrefix(t, prefix)}
	ctx := context.Background()
	const n = 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, answered := []string{}, map[string]int{}
	for i := range n {
		wg.Go(func() {
			j := &handoffv1.Job{RunId: fmt.Sprintf("race-%d", i), JobId: "tkt_race", RequestId: "req_race", Goal: "same",
				State: handoffv1.JobState_JOB_STATE_RUNNING, Wallet: &handoffv1.Budget{HopsRemaining: 5}}
			run, ok, err := clients[i%2].CreateRun(ctx, j, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("submission %d: %v", i, err)
			case ok:
				created = append(created, run.GetRunId())
			default:
				answered[run.GetRunId()]++
			}
		})
	}
	wg.Wait()
	if len(created) != 1 || answered[created[0]] != n-1 {
		t.Fatalf("%d racing submissions of one request: created %v, answered %v; want one run, the rest answered with it", n, created, answered)
	}
	runID := created[0]
	if evs, err := clients[0].Events(ctx, runID, 0); err != nil || len(evs) != 1 {
		t.Fatalf("the run's timeline = %d events, %v; want its one SUBMITTED event", len(evs), err)
	}
	var held []uint64
	for i := range n {
		wg.Go(func() {
			ok, epoch, err := clients[i%2].AcquireLeaseFence(ctx, "run:"+runID, fmt.Sprintf("replica-%d", i), time.Minute, runID)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("AcquireLeaseFence %d: %v", i, err)
			}
			if ok {
				held = append(held, epoch)
			}
		})
	}
	wg.Wait()
	if len(held) != 1 || held[0] == 0 {
		t.Fatalf("%d racing AcquireLeaseFence: held with epochs %v; want exactly one, with an epoch", n, held)
	}
	if takeover, err := clients[1].FenceRun(ctx, runID); err != nil || takeover <= held[0] {
		t.Fatalf("takeover FenceRun = %d, %v; want above %d", takeover, err, held[0])
	}
}
