package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestMain stops the local Redis Cluster the cluster tests start (storetest.ClusterAddrs).
func TestMain(m *testing.M) { storetest.Main(m) }

// TestCluster: the whole contract suite on a Redis Cluster of three masters and three
// replicas. A script whose keys were in two slots would fail there with CROSSSLOT.
func TestCluster(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return storetest.OpenCluster(t)
	})
}

// TestClusterURL: --store redis-cluster://... opens a store on the cluster, through any one
// of its nodes.
func TestClusterURL(t *testing.T) {
	addrs := storetest.ClusterAddrs(t)
	prefix := storetest.ClusterPrefix(t)
	ctx := context.Background()
	u := "redis-cluster://" + addrs[4] + "?prefix=" + url.QueryEscape(prefix)
	st, err := store.OpenURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, _, err := st.CreateRun(ctx, &handoffv1.Job{RunId: "run-url", JobId: "job-url", RequestId: "req-url",
		Wallet: &handoffv1.Budget{HopsRemaining: 2}}); err != nil {
		t.Fatal(err)
	}
	rdb := storetest.ClusterClient(t)
	if n := rdb.Exists(ctx, prefix+"{run-url}:run").Val(); n != 1 {
		t.Fatalf("run written through %s not found at %s{run-url}:run", u, prefix)
	}
}

// TestClusterSpread: the keys of 1,000 runs (each with a request, a wallet, events, a hop's
// claim and a ledger write) land on all three masters, and each run's own keys are in one
// slot, its run's; every operation ran on the cluster, so none crossed slots.
func TestClusterSpread(t *testing.T) {
	prefix := storetest.ClusterPrefix(t)
	s, err := store.OpenRedis(context.Background(), store.RedisOptions{Cluster: storetest.ClusterAddrs(t), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rdb := storetest.ClusterClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 1000
	errs := make(chan error, n)
	sem := make(chan struct{}, 32)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			id := fmt.Sprintf("run-%04d", i)
			job := &handoffv1.Job{RunId: id, JobId: "job-" + id, RequestId: "req-" + id, Wallet: &handoffv1.Budget{HopsRemaining: 3, UsdRemainingMicros: 10}}
			_, _, err := s.CreateRun(ctx, job, &handoffv1.JobEvent{Stage: "intake"})
			if err == nil {
				_, err = s.AppendEvent(ctx, id, &handoffv1.JobEvent{Stage: "draft"})
			}
			if err == nil {
				var a store.Admission
				a, err = s.Admit(ctx, "stage:"+id+":draft:0", time.Minute, id, store.Debit{Hops: 1, Job: "job-" + id})
				if err == nil && !a.Debited {
					err = fmt.Errorf("admit %s: %+v", id, a)
				}
			}
			if err == nil && i%10 == 0 {
				_, _, err = s.AppendLedgerComplete(ctx, "ledger-"+id, []byte("x"), "wb:"+id, "writer", 0, func(e store.LedgerEntry) ([]byte, error) { return []byte(e.ID), nil })
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// Keys of this test on each master.
	var mu sync.Mutex
	perMaster := map[string]int{}
	var all []string
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		var keys []string
		iter := m.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		mu.Lock()
		perMaster[m.Options().Addr] = len(keys)
		all = append(all, keys...)
		mu.Unlock()
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(perMaster) != 3 {
		t.Fatalf("masters = %v, want 3", perMaster)
	}
	t.Logf("keys per master: %v", perMaster)
	for m, c := range perMaster {
		// 1,000 runs' ~7 keys each over 3 masters: about 2,300 each; a third of that is far
		// below what hashing gives and far above what one hot shard would leave the others.
		if c < 700 {
			t.Errorf("master %s holds %d keys of the test, want its share of %d (all: %v)", m, c, len(all), perMaster)
		}
	}
	// Each run's records share its run's slot.
	for _, id := range []string{"run-0000", "run-0457", "run-0999"} {
		want := rdb.ClusterKeySlot(ctx, prefix+"{"+id+"}:run").Val()
		for _, kind := range []string{"events", "wallet"} {
			if got := rdb.ClusterKeySlot(ctx, prefix+"{"+id+"}:"+kind).Val(); got != want {
				t.Errorf("%s's %s is in slot %d, its run in %d", id, kind, got, want)
			}
		}
		if c := rdb.ClusterCountKeysInSlot(ctx, int(want)).Val(); c < 3 {
			t.Errorf("slot %d of %s holds %d keys, want its run, events and wallet", want, id, c)
		}
	}
	ids := storetest.PagedRunIDs(t, s, 0, 150, 10)
	if len(ids) != n || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != n {
		t.Errorf("ListRuns over the cluster, 150 a page: %d runs (%d distinct), want each of %d once", len(ids), len(slices.Compact(slices.Sorted(slices.Values(ids)))), n)
	}
}

// redisAndCluster opens a store on one Redis ("redis") and on the Redis Cluster
// ("cluster"), each under a key prefix of its own, and returns it with a raw client of the
// same server(s) and the prefix, for tests that plant keys the store then finds.
var redisAndCluster = map[string]func(t *testing.T) (*store.Redis, redis.Cmdable, string){
	"redis": func(t *testing.T) (*store.Redis, redis.Cmdable, string) {
		p := storetest.RedisPrefix(t)
		return storetest.OpenRedisPrefix(t, p), storetest.RedisClient(t), p
	},
	"cluster": func(t *testing.T) (*store.Redis, redis.Cmdable, string) {
		p := storetest.ClusterPrefix(t)
		s, err := store.OpenRedis(context.Background(), store.RedisOptions{Cluster: storetest.ClusterAddrs(t), Prefix: p})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s, storetest.ClusterClient(t), p
	},
}

// TestRedisCreateRunCrashWindows: what a CreateRun that stopped between its scripts leaves
// (see Redis.CreateRun) is finished or skipped, on one Redis and on the cluster: a request
// reserved for a run never stored is created by its retry under the reserved run id; a run
// listed in the index but never stored is skipped by ListRuns; and concurrent creates of
// one request create one run, which all of them return.
func TestRedisCreateRunCrashWindows(t *testing.T) {
	for name, open := range redisAndCluster {
		t.Run(name, func(t *testing.T) {
			s, rdb, prefix := open(t)
			ctx := context.Background()
			job := &handoffv1.Job{RunId: "run-retry", JobId: "job-1", RequestId: "req-1", Goal: "g", Wallet: &handoffv1.Budget{HopsRemaining: 2}}
			reserved := proto.Clone(job).(*handoffv1.Job)
			reserved.RunId = "run-lost"
			// The first attempt reserved the request, then stopped.
			if err := errors.Join(rdb.Set(ctx, prefix+"{req-1}:request", "run-lost", 0).Err(),
				rdb.Set(ctx, prefix+"{req-1}:requestsum", store.RequestDigest(reserved), 0).Err()); err != nil {
				t.Fatal(err)
			}
			got, created, err := s.CreateRun(ctx, job, &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_SUBMITTED})
			if err != nil || !created || got.GetRunId() != "run-lost" {
				t.Fatalf("retry of a reserved, never stored request = %v, %v, %v; want run-lost created", got.GetRunId(), created, err)
			}
			if w, err := s.WalletFor(ctx, "run-lost", "job-1"); err != nil || w.GetHopsRemaining() != 2 {
				t.Fatalf("wallet of the finished run = %v, %v", w, err)
			}
			if _, err := s.GetRun(ctx, "run-retry"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the retry's own run id was stored too: %v", err)
			}
			// An index entry whose run was never stored.
			if err := rdb.ZAdd(ctx, prefix+"{runs:0}:index", redis.Z{Score: 1, Member: "run-ghost"}).Err(); err != nil {
				t.Fatal(err)
			}
			if ids := storetest.PagedRunIDs(t, s, 0, 1, 5); fmt.Sprint(ids) != "[run-lost]" {
				t.Fatalf("runs listed = %v, want [run-lost] (the ghost skipped)", ids)
			}
			// Concurrent creates of one request.
			var wg sync.WaitGroup
			var made atomic.Int32
			ids := make([]string, 16)
			for i := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					j := &handoffv1.Job{RunId: fmt.Sprintf("run-c%d", i), JobId: "job-2", RequestId: "req-2", Goal: "g"}
					got, created, err := s.CreateRun(ctx, j)
					if err != nil {
						t.Error(err)
						return
					}
					if created {
						made.Add(1)
					}
					ids[i] = got.GetRunId()
				}()
			}
			wg.Wait()
			if made.Load() != 1 || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != 1 {
				t.Fatalf("16 concurrent creates of one request: %d created, run ids %v; want 1, one id", made.Load(), ids)
			}
		})
	}
}

// TestClusterWait: the contract suite again with every claim, receipt and ledger write
// waiting for one replica (?wait=1): each such write is on a replica when the call returns.
func TestClusterWait(t *testing.T) {
	open := func(t *testing.T) *store.Redis {
		prefix := storetest.ClusterPrefix(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := store.OpenRedis(ctx, store.RedisOptions{Cluster: storetest.ClusterAddrs(t), Prefix: prefix, WaitReplicas: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
	t.Run("OnTheReplica", func(t *testing.T) {
		ctx := context.Background()
		prefix := storetest.ClusterPrefix(t)
		s, err := store.OpenRedis(ctx, store.RedisOptions{Cluster: storetest.ClusterAddrs(t), Prefix: prefix, WaitReplicas: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if st, _, _, err := s.Claim(ctx, "k-waited", time.Minute); err != nil || st != store.Claimed {
			t.Fatalf("Claim = %v, %v", st, err)
		}
		// Every node's own view, replicas included: the key must be on two of the six (its
		// master and its replica) the moment Claim returned.
		on := 0
		for _, a := range storetest.ClusterAddrs(t) {
			c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
			pipe := c.Pipeline()
			pipe.ReadOnly(ctx)
			ex := pipe.Exists(ctx, prefix+"{k-waited}:idem")
			pipe.Exec(ctx)
			if ex.Val() == 1 {
				on++
			}
			c.Close()
		}
		if on != 2 {
			t.Fatalf("the waited claim is on %d nodes, want 2 (its master and its replica)", on)
		}
	})
}

// TestRedisCreateRunLeased: on one Redis, CreateRunLeased keeps the whole RunLeaser contract
// (storetest.CreateRunLeased) and a run without a request id is one script, one round trip.
// On a cluster, where no script may span the run's and the lease's slots, it creates the run
// as CreateRun does and takes no lease, which the caller's AcquireLeaseFence then takes at
// epoch 1. On both, a retry that finishes the run an earlier attempt reserved under another
// id takes no lease: the lease named is for the id asked for.
func TestRedisCreateRunLeased(t *testing.T) {
	ctx := context.Background()
	claim := func(runID string) store.LeaseClaim {
		return store.LeaseClaim{Name: "run:" + runID, Owner: "owner-a", TTL: time.Minute}
	}
	submitted := func(runID, requestID string) *handoffv1.Job {
		return &handoffv1.Job{RunId: runID, JobId: "job-" + runID, RequestId: requestID, Goal: "g",
			State: handoffv1.JobState_JOB_STATE_RUNNING, Wallet: &handoffv1.Budget{HopsRemaining: 2}}
	}
	t.Run("redis", func(t *testing.T) {
		storetest.CreateRunLeased(t, storetest.OpenRedis(t))

		s := storetest.OpenRedis(t)
		var calls atomic.Int32
		store.RedisClientOf(s).AddHook(countHook{&calls})
		run, created, epoch, err := s.CreateRunLeased(ctx, submitted("rl-one", ""), claim("rl-one"))
		if err != nil || !created || epoch != 1 || run.GetRunId() != "rl-one" {
			t.Fatalf("CreateRunLeased = %v, %v, %d, %v; want rl-one created at epoch 1", run.GetRunId(), created, epoch, err)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("CreateRunLeased of a run without a request id made %d Redis calls, want 1", n)
		}
	})
	t.Run("redis lease key of another type", func(t *testing.T) {
		p := storetest.RedisPrefix(t)
		s, rdb := storetest.OpenRedisPrefix(t, p), storetest.RedisClient(t)
		for _, rid := range []string{"", "req-wt"} {
			id := "rl-wt" + rid
			key := p + "{run:" + id + "}:lease"
			if err := rdb.HSet(ctx, key, "not", "a lease").Err(); err != nil {
				t.Fatal(err)
			}
			_, created, epoch, err := s.CreateRunLeased(ctx, submitted(id, rid), claim(id))
			if err == nil || !strings.Contains(err.Error(), "run:"+id) || created || epoch != 0 {
				t.Fatalf("CreateRunLeased (request %q) with a hash at the lease key = %v, %d, %v; want an error naming the lease", rid, created, epoch, err)
			}
			if _, err := s.GetRun(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the refused run %s was stored: %v", id, err)
			}
			if err := rdb.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			run, created, epoch, err := s.CreateRunLeased(ctx, submitted(id, rid), claim(id))
			if err != nil || !created || epoch != 1 || run.GetRunId() != id {
				t.Fatalf("CreateRunLeased (request %q) once the key is gone = %v, %v, %d, %v; want %s created at epoch 1", rid, run.GetRunId(), created, epoch, err, id)
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		s := storetest.OpenCluster(t)
		run, created, epoch, err := s.CreateRunLeased(ctx, submitted("rl-c", ""), claim("rl-c"))
		if err != nil || !created || epoch != 0 || run.GetRunId() != "rl-c" {
			t.Fatalf("CreateRunLeased on a cluster = %v, %v, %d, %v; want rl-c created, no epoch", run.GetRunId(), created, epoch, err)
		}
		held, epoch, err := s.AcquireLeaseFence(ctx, "run:rl-c", "owner-b", time.Minute, "rl-c")
		if err != nil || !held || epoch != 1 {
			t.Fatalf("AcquireLeaseFence after it = %v, %d, %v; want held at epoch 1 (nothing taken before)", held, epoch, err)
		}
		if _, _, _, err := s.CreateRunLeased(ctx, submitted("rl-bad", ""), store.LeaseClaim{Name: "run:rl-bad", Owner: "owner-a"}); err == nil {
			t.Fatal("CreateRunLeased on a cluster with no lease ttl succeeded")
		}
		if _, err := s.GetRun(ctx, "rl-bad"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused lease's run was stored: %v", err)
		}
	})
	for name, open := range redisAndCluster {
		t.Run(name+" reserved", func(t *testing.T) {
			s, rdb, prefix := open(t)
			job := submitted("run-retry", "req-1")
			reserved := proto.Clone(job).(*handoffv1.Job)
			reserved.RunId = "run-lost"
			if err := errors.Join(rdb.Set(ctx, prefix+"{req-1}:request", "run-lost", 0).Err(),
				rdb.Set(ctx, prefix+"{req-1}:requestsum", store.RequestDigest(reserved), 0).Err()); err != nil {
				t.Fatal(err)
			}
			run, created, epoch, err := s.CreateRunLeased(ctx, job, claim("run-retry"))
			if err != nil || !created || epoch != 0 || run.GetRunId() != "run-lost" {
				t.Fatalf("CreateRunLeased finishing a reserved request = %v, %v, %d, %v; want run-lost created, no epoch", run.GetRunId(), created, epoch, err)
			}
			for _, id := range []string{"run-retry", "run-lost"} {
				held, epoch, err := s.AcquireLeaseFence(ctx, "run:"+id, "owner-b", time.Minute, id)
				if err != nil || !held || epoch != 1 {
					t.Fatalf("AcquireLeaseFence(run:%s) = %v, %d, %v; want held at epoch 1 (no lease or epoch taken before)", id, held, epoch, err)
				}
			}
		})
	}
}

// countHook counts the commands and pipelines a client sends.
type countHook struct{ n *atomic.Int32 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}
