package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

func TestRedis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return storetest.OpenRedis(t)
	})
}

func TestOpenRedisUnreachable(t *testing.T) {
	// A port that was just free: nothing listens there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := store.OpenRedis(ctx, store.RedisOptions{Addr: addr, DialTimeout: 500 * time.Millisecond})
	if err == nil {
		s.Close()
		t.Fatalf("OpenRedis(%s) with nothing listening succeeded", addr)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Fatalf("OpenRedis error %q does not name the address %s", err, addr)
	}
	t.Log(err)
}

// TestRedisSharedClient: a passed-in client is used, and Close leaves it open for its owner.
func TestRedisSharedClient(t *testing.T) {
	rdb := storetest.RedisClient(t)
	prefix := storetest.RedisPrefix(t)
	s, err := store.OpenRedis(context.Background(), store.RedisOptions{Client: rdb, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenWallet(context.Background(), "w", "job-w", &handoffv1.Budget{HopsRemaining: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Close closed a client it was given: %v", err)
	}
	if n, _ := rdb.Exists(context.Background(), prefix+"{w}:wallet").Result(); n != 1 {
		t.Fatalf("wallet not stored at %s{w}:wallet", prefix)
	}
}

// TestRedisKeysStayUnderPrefix: every key any operation writes starts with the prefix.
func TestRedisKeysStayUnderPrefix(t *testing.T) {
	rdb := storetest.RedisClient(t)
	prefix := storetest.RedisPrefix(t)
	s := storetest.OpenRedisPrefix(t, prefix)
	ctx := context.Background()
	rnd := make([]byte, 8)
	rand.Read(rnd)
	tok := "tok" + hex.EncodeToString(rnd) // marks every key this test's operations write
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-" + tok, JobId: "job-" + tok, RequestId: "req-" + tok}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, "run-"+tok, &handoffv1.JobEvent{Stage: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenWallet(ctx, "w-"+tok, "job-"+tok, &handoffv1.Budget{HopsRemaining: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Debit(ctx, "w-"+tok, store.Debit{Hops: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Claim(ctx, "k-"+tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.AppendLedger(ctx, "k-"+tok, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var all []string
	iter := rdb.Scan(ctx, 0, "*"+tok+"*", 1000).Iterator()
	for iter.Next(ctx) {
		all = append(all, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if !strings.HasPrefix(k, prefix) {
			t.Errorf("key %q is outside the prefix %q", k, prefix)
		}
	}
	own := storetest.RedisKeys(t, rdb, prefix)
	// run, its index bucket, request, requestsum, jobsum, events, wallet, idem, and the
	// ledger's entries, keys and offers.
	if len(own) != 11 {
		t.Errorf("keys under the prefix = %v, want the 11 of the documented layout", own)
	}
}

// TestRedisCrossClientClaim: two stores with their own connections (as two processes would
// have) racing for one key: exactly one claims it.
func TestRedisCrossClientClaim(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	a, b := storetest.OpenRedisPrefix(t, prefix), storetest.OpenRedisPrefix(t, prefix)
	stores := []store.Store{a, b}
	var claimed, pending atomic.Int32
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _, _, err := stores[i%2].Claim(context.Background(), "contended", time.Minute)
			switch {
			case err != nil:
				t.Error(err)
			case st == store.Claimed:
				claimed.Add(1)
			case st == store.Pending:
				pending.Add(1)
			}
		}()
	}
	wg.Wait()
	if claimed.Load() != 1 || pending.Load() != 99 {
		t.Fatalf("100 claims across two clients: %d claimed, %d pending; want 1, 99", claimed.Load(), pending.Load())
	}
}

// TestRedisCrossClientDebit: 100 one-hop debits from two clients on a 10-hop wallet.
func TestRedisCrossClientDebit(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	a, b := storetest.OpenRedisPrefix(t, prefix), storetest.OpenRedisPrefix(t, prefix)
	ctx := context.Background()
	if _, err := a.OpenWallet(ctx, "hot", "job-hot", &handoffv1.Budget{UsdRemainingMicros: 1000, HopsRemaining: 10}); err != nil {
		t.Fatal(err)
	}
	ok, empty := storetest.RaceDebits(t, []store.Store{a, b}, "hot", store.Debit{Hops: 1})
	w, err := b.Wallet(ctx, "hot")
	if err != nil || ok != 10 || empty != 90 || w.GetHopsRemaining() != 0 || w.GetUsdRemainingMicros() != 1000 {
		t.Fatalf("100 debits across two clients: %d ok, %d empty, wallet %v (%v); want 10, 90, hops 0", ok, empty, w, err)
	}
}

// TestRedisListRunsBatches: a filtered listing whose matches lie beyond the first batch that
// ListRuns reads from the index still finds them, in order, one page at a time.
func TestRedisListRunsBatches(t *testing.T) {
	s := storetest.OpenRedis(t)
	ctx := context.Background()
	for i := 1; i <= 600; i++ {
		st := handoffv1.JobState_JOB_STATE_COMPLETED
		if i <= 2 { // only the two oldest match
			st = handoffv1.JobState_JOB_STATE_ESCALATED
		}
		if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: fmt.Sprintf("run-%d", i), State: st}); err != nil {
			t.Fatal(err)
		}
	}
	ids := storetest.PagedRunIDs(t, s, handoffv1.JobState_JOB_STATE_ESCALATED, 1, 5)
	if fmt.Sprint(ids) != "[run-2 run-1]" {
		t.Fatalf("filtered listing across batches = %v, want [run-2 run-1]", ids)
	}
	all, next, err := s.ListRuns(ctx, 0, 0, "")
	if err != nil || len(all) != 100 || all[0].GetRunId() != "run-600" || next == "" {
		t.Fatalf("ListRuns(limit 0) = %d runs, next %q, %v; want the default 100, newest first", len(all), next, err)
	}
}

// TestRedisErrorsNameServer: failures say which server they came from.
func TestRedisErrorsNameServer(t *testing.T) {
	s := storetest.OpenRedis(t)
	_, err := s.GetRun(context.Background(), "missing")
	if !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "redis "+storetest.RedisAddr()) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("GetRun(missing) = %v; want ErrNotFound naming the server and the run", err)
	}
}

var benchKey atomic.Int64

func benchClaim(b *testing.B, s store.Store) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("bench-%d", benchKey.Add(1))
			if st, _, _, err := s.Claim(ctx, key, time.Minute); err != nil || st != store.Claimed {
				b.Errorf("Claim(%s) = %v, %v", key, st, err)
				return
			}
		}
	})
}

// BenchmarkRedisClaim: uncontended claims of fresh keys (one script round trip each).
func BenchmarkRedisClaim(b *testing.B) {
	s := storetest.OpenRedis(b)
	benchClaim(b, s)
}

// BenchmarkBoltClaim: the same on the embedded store, for comparison (one fsync'd write
// transaction each).
func BenchmarkBoltClaim(b *testing.B) {
	s, err := store.Open(filepath.Join(b.TempDir(), "handoff.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	benchClaim(b, s)
}

// BenchmarkRedisAdmit: the runner's admission of a fresh key, serial: the claim, the job
// check and the debit of one wallet in one script, and the Complete after the work, as a
// hop makes them (allocations per op are the figure; the round trips set the time).
func BenchmarkRedisAdmit(b *testing.B) {
	s := storetest.OpenRedis(b)
	ctx := context.Background()
	if _, err := s.OpenWallet(ctx, "w-admit", "job-admit", &handoffv1.Budget{HopsRemaining: 1 << 30}); err != nil {
		b.Fatal(err)
	}
	d := store.Debit{Hops: 1, Job: "job-admit", CheckVerdict: true}
	value := []byte("result of the hop")
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		key := "admit-" + strconv.Itoa(i)
		a, err := s.Admit(ctx, key, time.Minute, "w-admit", d)
		if err != nil || a.State != store.Claimed || !a.Debited {
			b.Fatalf("Admit(%s) = %+v, %v; want claimed and debited", key, a, err)
		}
		if err := s.Complete(ctx, key, a.Owner, value, time.Hour); err != nil {
			b.Fatalf("Complete(%s): %v", key, err)
		}
	}
}
