package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestRedisRingKeepsSlotsApart: a shared client that spreads keys over several servers by
// their hash tag (a go-redis Ring; here two shards, databases 0 and 1 of the test server)
// must get only scripts whose keys share one tag, as a cluster does. A script of several
// tags runs on the shard of its first key and writes the others where nobody reads them:
// a created run its store cannot find, a submit's epoch the run's fence never saw.
func TestRedisRingKeepsSlotsApart(t *testing.T) {
	prefix := storetest.RedisPrefix(t) // deletes the prefix's keys in database 0 when t ends
	addr := storetest.RedisAddr()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	second := net.JoinHostPort(host, port) + "?db1" // a shard name of its own; NewClient dials it as database 1
	db1 := redis.NewClient(&redis.Options{Addr: addr, DB: 1, MaxRetries: -1})
	t.Cleanup(func() {
		ctx := context.Background()
		iter := db1.Scan(ctx, 0, prefix+"*", 100).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			db1.Del(ctx, keys...)
		}
		db1.Close()
	})
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:      map[string]string{"a": addr, "b": second},
		MaxRetries: -1,
		NewClient: func(o *redis.Options) *redis.Client {
			if o.Addr == second {
				o.Addr, o.DB = addr, 1
			}
			return redis.NewClient(o)
		},
	})
	t.Cleanup(func() { ring.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := store.OpenRedis(ctx, store.RedisOptions{Client: ring, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	for i := range 8 { // enough run ids that their keys fall on both shards
		runID := fmt.Sprintf("ring-%d", i)
		job := &handoffv1.Job{RunId: runID, JobId: "job-" + runID, State: handoffv1.JobState_JOB_STATE_RUNNING,
			Wallet: &handoffv1.Budget{HopsRemaining: 3}}
		if _, created, err := s.CreateRun(ctx, job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED}); err != nil || !created {
			t.Fatalf("CreateRun(%s) = %v, %v", runID, created, err)
		}
		if got, err := s.GetRun(ctx, runID); err != nil || got.GetJobId() != job.GetJobId() {
			t.Fatalf("GetRun(%s) after CreateRun = %v, %v; want the run just created", runID, got, err)
		}
		if evs, err := s.Events(ctx, runID, 0); err != nil || len(evs) != 1 {
			t.Fatalf("Events(%s) after CreateRun = %d events, %v; want the SUBMITTED event", runID, len(evs), err)
		}
		runs, _, err := s.ListRuns(ctx, handoffv1.JobState_JOB_STATE_UNSPECIFIED, 100, "")
		if err != nil {
			t.Fatal(err)
		}
		listed := false
		for _, r := range runs {
			listed = listed || r.GetRunId() == runID
		}
		if !listed {
			t.Fatalf("ListRuns after CreateRun(%s) does not list it", runID)
		}
		if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: runID + "-other", JobId: job.GetJobId(), Goal: "other content"}); !errors.Is(err, store.ErrJobConflict) {
			t.Fatalf("CreateRun of job %s with other content = %v; want ErrJobConflict", job.GetJobId(), err)
		}

		// The submitter's lease and epoch, then a takeover's: the takeover's epoch is higher,
		// and the submitter's save is refused while the takeover's goes through.
		name := "run:" + runID
		held, epoch, err := s.AcquireLeaseFence(ctx, name, "submitter", time.Minute, runID)
		if err != nil || !held || epoch == 0 {
			t.Fatalf("AcquireLeaseFence(%s) = %v, %d, %v", runID, held, epoch, err)
		}
		if err := s.PutRunFenced(ctx, job, epoch); err != nil {
			t.Fatalf("the submitter's save under its epoch %d: %v", epoch, err)
		}
		if ok, err := s.AcquireLease(ctx, name, "other", time.Minute); err != nil || ok {
			t.Fatalf("another owner's AcquireLease while the submitter holds it = %v, %v; want refused", ok, err)
		}
		if err := s.ReleaseLease(ctx, name, "submitter"); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.AcquireLease(ctx, name, "other", time.Minute); err != nil || !ok {
			t.Fatalf("AcquireLease after the release = %v, %v; want held", ok, err)
		}
		takeover, err := s.FenceRun(ctx, runID)
		if err != nil || takeover <= epoch {
			t.Fatalf("takeover FenceRun(%s) = %d, %v; want above the submitter's %d", runID, takeover, err, epoch)
		}
		if err := s.PutRunFenced(ctx, job, epoch); !errors.Is(err, store.ErrFenced) {
			t.Fatalf("the submitter's save after the takeover = %v; want ErrFenced", err)
		}
	}
}
