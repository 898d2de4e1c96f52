package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// testRedisAddr is the server the Redis tests use: HANDOFF_TEST_REDIS, or the local default.
func testRedisAddr() string {
	if a := os.Getenv("HANDOFF_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// requireRedis returns a raw client on the test server. Without a server the test fails under
// CI (which must never skip silently) and is skipped elsewhere, saying how to start one.
func requireRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	addr := testRedisAddr()
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		msg := fmt.Sprintf("no Redis at %s (%v): start one with `redis-server --port 6379 --save '' --appendonly no`, or point HANDOFF_TEST_REDIS at one", addr, err)
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	tb.Cleanup(func() { rdb.Close() })
	return rdb
}

// testPrefix is unique to one test, so tests sharing the server never see each other's keys.
func testPrefix(tb testing.TB) string {
	b := make([]byte, 6)
	rand.Read(b)
	return "handofftest:" + tb.Name() + ":" + hex.EncodeToString(b) + ":"
}

// globEscape quotes the pattern characters of SCAN MATCH, so a test name matches literally.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// keysWithPrefix lists every key under prefix.
func keysWithPrefix(tb testing.TB, rdb *redis.Client, prefix string) []string {
	tb.Helper()
	var keys []string
	iter := rdb.Scan(context.Background(), 0, globEscape(prefix)+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		tb.Fatalf("scan %s*: %v", prefix, err)
	}
	return keys
}

// deletePrefixOnCleanup deletes, when the test ends, only the keys under prefix.
func deletePrefixOnCleanup(tb testing.TB, rdb *redis.Client, prefix string) {
	tb.Cleanup(func() {
		keys := keysWithPrefix(tb, rdb, prefix)
		for len(keys) > 0 {
			n := min(len(keys), 500)
			if err := rdb.Del(context.Background(), keys[:n]...).Err(); err != nil {
				tb.Errorf("cleanup %s*: %v", prefix, err)
				return
			}
			keys = keys[n:]
		}
	})
}

// openRedis opens a store on the test server under prefix, closed when the test ends.
func openRedis(tb testing.TB, prefix string) *store.Redis {
	tb.Helper()
	s, err := store.OpenRedis(context.Background(), store.RedisOptions{Addr: testRedisAddr(), Prefix: prefix})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// newRedisStore is a fresh, empty store: its own prefix, deleted afterwards.
func newRedisStore(tb testing.TB) (*store.Redis, string) {
	tb.Helper()
	rdb := requireRedis(tb)
	prefix := testPrefix(tb)
	deletePrefixOnCleanup(tb, rdb, prefix)
	return openRedis(tb, prefix), prefix
}

func TestRedis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _ := newRedisStore(t)
		return s
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
	rdb := requireRedis(t)
	prefix := testPrefix(t)
	deletePrefixOnCleanup(t, rdb, prefix)
	s, err := store.OpenRedis(context.Background(), store.RedisOptions{Client: rdb, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenWallet(context.Background(), "w", &handoffv1.Budget{HopsRemaining: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Close closed a client it was given: %v", err)
	}
	if n, _ := rdb.Exists(context.Background(), prefix+"wallet:w").Result(); n != 1 {
		t.Fatalf("wallet not stored at %swallet:w", prefix)
	}
}

// TestRedisKeysStayUnderPrefix: every key any operation writes starts with the prefix.
func TestRedisKeysStayUnderPrefix(t *testing.T) {
	rdb := requireRedis(t)
	s, prefix := newRedisStore(t)
	ctx := context.Background()
	rnd := make([]byte, 8)
	rand.Read(rnd)
	tok := "tok" + hex.EncodeToString(rnd) // marks every key this test's operations write
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-" + tok, RequestId: "req-" + tok}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, "run-"+tok, &handoffv1.JobEvent{Stage: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenWallet(ctx, "w-"+tok, &handoffv1.Budget{HopsRemaining: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Debit(ctx, "w-"+tok, store.Debit{Hops: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, "k-"+tok, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendLedger(ctx, "k-"+tok, []byte("x")); err != nil {
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
	own := keysWithPrefix(t, rdb, prefix)
	// run, runs:index, runs:seq, request, events, wallet, idem, ledger.
	if len(own) != 8 {
		t.Errorf("keys under the prefix = %v, want the 8 of the documented layout", own)
	}
}

// TestRedisCrossClientClaim: two stores with their own connections (as two processes would
// have) racing for one key: exactly one claims it.
func TestRedisCrossClientClaim(t *testing.T) {
	a, prefix := newRedisStore(t)
	b := openRedis(t, prefix)
	stores := []store.Store{a, b}
	var claimed, pending atomic.Int32
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _, err := stores[i%2].Claim(context.Background(), "contended", time.Minute)
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
	a, prefix := newRedisStore(t)
	b := openRedis(t, prefix)
	ctx := context.Background()
	if _, err := a.OpenWallet(ctx, "hot", &handoffv1.Budget{UsdRemainingMicros: 1000, HopsRemaining: 10}); err != nil {
		t.Fatal(err)
	}
	stores := []store.Store{a, b}
	var ok, empty atomic.Int32
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := stores[i%2].Debit(ctx, "hot", store.Debit{Hops: 1})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, store.ErrWalletEmpty):
				empty.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	w, err := b.Wallet(ctx, "hot")
	if err != nil || ok.Load() != 10 || empty.Load() != 90 || w.GetHopsRemaining() != 0 || w.GetUsdRemainingMicros() != 1000 {
		t.Fatalf("100 debits across two clients: %d ok, %d empty, wallet %v (%v); want 10, 90, hops 0", ok.Load(), empty.Load(), w, err)
	}
}

// TestRedisListRunsBatches: a filtered listing whose matches lie beyond the first batch that
// ListRuns reads from the index still finds them, in order, one page at a time.
func TestRedisListRunsBatches(t *testing.T) {
	s, _ := newRedisStore(t)
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
	var ids []string
	token := ""
	for page := 0; page < 5; page++ {
		runs, next, err := s.ListRuns(ctx, handoffv1.JobState_JOB_STATE_ESCALATED, 1, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			ids = append(ids, r.GetRunId())
		}
		if next == "" {
			break
		}
		token = next
	}
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
	s, _ := newRedisStore(t)
	_, err := s.GetRun(context.Background(), "missing")
	if !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "redis "+testRedisAddr()) || !strings.Contains(err.Error(), "missing") {
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
			if st, _, err := s.Claim(ctx, key, time.Minute); err != nil || st != store.Claimed {
				b.Errorf("Claim(%s) = %v, %v", key, st, err)
				return
			}
		}
	})
}

// BenchmarkRedisClaim: uncontended claims of fresh keys (one script round trip each).
func BenchmarkRedisClaim(b *testing.B) {
	s, _ := newRedisStore(b)
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
