package store_test

// Stores written before wallets recorded their job and runs their content digests: what
// such records mean to this version (see store.Wallets.OpenWallet, store.Runs.CreateRun).

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

var (
	oldWallet = &handoffv1.Budget{UsdRemainingMicros: 700, RevisionsRemaining: 1, HopsRemaining: 4}
	oldRun    = &handoffv1.Job{RunId: "run-old", JobId: "tkt_old", RequestId: "req-old", Pipeline: "support", Goal: "triage",
		Constraints: []string{"no refund promises"}, State: handoffv1.JobState_JOB_STATE_RUNNING, Wallet: oldWallet,
		// Artifacts grown since submit: a legacy request is compared on its intake only.
		Artifacts: []*handoffv1.Artifact{{Type: "note", SchemaVersion: "note.v1", Uri: "file:///a/tkt_old/draft-r0/note.txt"}}}
)

func TestLegacyBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	s, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// As an older release left it: a run, its request id and its wallet, and no record of
	// the wallet's job or of any digest.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		run, _ := proto.Marshal(oldRun)
		w, _ := proto.Marshal(oldWallet)
		return errors.Join(tx.Bucket([]byte("runs")).Put([]byte("run-old"), run),
			tx.Bucket([]byte("requests")).Put([]byte("req-old"), []byte("run-old")),
			tx.Bucket([]byte("wallets")).Put([]byte("run-old"), w))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err = store.Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testLegacy(t, s)
}

func TestLegacyRedis(t *testing.T) {
	rdb := storetest.RedisClient(t)
	prefix := storetest.RedisPrefix(t)
	s := storetest.OpenRedisPrefix(t, prefix)
	ctx := context.Background()
	run, _ := proto.Marshal(oldRun)
	if err := errors.Join(rdb.Set(ctx, prefix+"run:run-old", run, 0).Err(),
		rdb.Set(ctx, prefix+"request:req-old", "run-old", 0).Err(),
		rdb.HSet(ctx, prefix+"wallet:run-old", "usd", "700", "revisions", "1", "hops", "4").Err()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.MigrateRedis(ctx, s); err != nil {
		t.Fatal(err)
	}
	testLegacy(t, s)
}

func testLegacy(t *testing.T, s store.Store) {
	ctx := context.Background()
	hop := store.Debit{Hops: 1, RequireMoney: true, Job: "tkt_old"}
	// A wallet that records no job pays for no package: it could be anyone's.
	if _, err := s.Debit(ctx, "run-old", hop); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("job-checked Debit of a legacy wallet = %v, want ErrWrongJob", err)
	}
	if a, err := s.Admit(ctx, "stage:tkt_old:draft:0", time.Minute, "run-old", hop); err != nil || !errors.Is(a.DebitErr, store.ErrWrongJob) || a.Debited {
		t.Fatalf("Admit from a legacy wallet = %+v, %v; want ErrWrongJob", a, err)
	}
	if _, err := s.WalletFor(ctx, "run-old", "tkt_old"); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("WalletFor of a legacy wallet = %v, want ErrWrongJob", err)
	}
	if w, err := s.Wallet(ctx, "run-old"); err != nil || !proto.Equal(w, oldWallet) {
		t.Fatalf("Wallet of a legacy wallet = %v, %v; want it as stored", w, err)
	}
	// Its run's coordinator opens it again when it loads the run: the wallet is the job's.
	if w, err := s.OpenWallet(ctx, "run-old", "tkt_old", &handoffv1.Budget{HopsRemaining: 99}); err != nil || !proto.Equal(w, oldWallet) {
		t.Fatalf("OpenWallet of a legacy wallet = %v, %v; want it adopted unchanged", w, err)
	}
	if w, err := s.Debit(ctx, "run-old", hop); err != nil || w.GetHopsRemaining() != 3 {
		t.Fatalf("job-checked Debit after adoption = %v, %v; want 3 hops left", w, err)
	}
	if _, err := s.OpenWallet(ctx, "run-old", "tkt_new", oldWallet); !errors.Is(err, store.ErrWrongJob) {
		t.Fatalf("OpenWallet of the adopted wallet for another job = %v, want ErrWrongJob", err)
	}

	// A request id recorded without a digest: its retry is told by the intake the earlier
	// run still holds.
	retry := proto.Clone(oldRun).(*handoffv1.Job)
	retry.RunId, retry.Artifacts, retry.Wallet = "run-retry", nil, &handoffv1.Budget{HopsRemaining: 1}
	if got, created, err := s.CreateRun(ctx, retry); err != nil || created || got.GetRunId() != "run-old" {
		t.Fatalf("retry of a legacy request = %v, %v, %v; want run-old", got.GetRunId(), created, err)
	}
	retry.Goal = "refund"
	if _, created, err := s.CreateRun(ctx, retry); !errors.Is(err, store.ErrRequestConflict) || created {
		t.Fatalf("legacy request id with another goal = %v, %v; want ErrRequestConflict", created, err)
	}
	// A job_id with runs from before digests: the first run created now fixes its content.
	first := proto.Clone(oldRun).(*handoffv1.Job)
	first.RunId, first.RequestId, first.Goal = "run-new-1", "", "triage, again"
	if _, created, err := s.CreateRun(ctx, first); err != nil || !created {
		t.Fatalf("first run of a legacy job_id = %v, %v; want created", created, err)
	}
	first.RunId, first.Goal = "run-new-2", "triage"
	if _, _, err := s.CreateRun(ctx, first); !errors.Is(err, store.ErrJobConflict) {
		t.Fatalf("a legacy job_id after its content was fixed = %v, want ErrJobConflict", err)
	}
}

// TestMigrateRedis: a prefix holding every kind of key of the layout before hash tags
// (a run in the global index, its events, wallet, request, an idempotency record with its
// expiry, a lease, the ledger) is refused by OpenURL until MigrateRedis moves it; then every
// record reads as before, runs keep their order below new runs, and a second migration
// moves nothing.
func TestMigrateRedis(t *testing.T) {
	rdb := storetest.RedisClient(t)
	prefix := storetest.RedisPrefix(t)
	s := storetest.OpenRedisPrefix(t, prefix)
	ctx := context.Background()
	ev, _ := proto.Marshal(&handoffv1.JobEvent{Stage: "intake"})
	var runs []any
	for i, id := range []string{"run-a", "run-b"} {
		b, _ := proto.Marshal(&handoffv1.Job{RunId: id, JobId: "job-" + id})
		runs = append(runs, prefix+"run:"+id, b)
		if err := rdb.ZAdd(ctx, prefix+"runs:index", redis.Z{Score: float64(i + 1), Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(rdb.MSet(ctx, runs...).Err(), rdb.Set(ctx, prefix+"runs:seq", "2", 0).Err(),
		rdb.RPush(ctx, prefix+"events:run-a", ev).Err(),
		rdb.HSet(ctx, prefix+"wallet:run-a", "usd", "5", "revisions", "0", "hops", "2", "job", "job-run-a").Err(),
		rdb.Set(ctx, prefix+"request:req-a", "run-a", 0).Err(),
		rdb.Set(ctx, prefix+"idem:k", "Ddone", time.Hour).Err(),
		rdb.Set(ctx, prefix+"lease:run:run-a", "coord-1", time.Hour).Err(),
		rdb.RPush(ctx, prefix+"ledger", `{"key":"lk","payload":"eA==","at":"2025-01-01T00:00:00Z"}`).Err()); err != nil {
		t.Fatal(err)
	}
	url := "redis://" + storetest.RedisAddr() + "/0?prefix=" + neturl.QueryEscape(prefix)
	if _, err := store.OpenURL(ctx, url); !errors.Is(err, store.ErrOldLayout) {
		t.Fatalf("OpenURL over the old layout = %v, want ErrOldLayout", err)
	}
	n, err := store.MigrateRedis(ctx, s)
	if err != nil || n != 9 {
		t.Fatalf("MigrateRedis = %d, %v; want 9 keys moved", n, err)
	}
	if n, err := store.MigrateRedis(ctx, s); err != nil || n != 0 {
		t.Fatalf("MigrateRedis again = %d, %v; want nothing moved", n, err)
	}
	s2, err := store.OpenURL(ctx, url)
	if err != nil {
		t.Fatalf("OpenURL after migrating: %v", err)
	}
	s2.Close()
	if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-c"}); err != nil {
		t.Fatal(err)
	}
	if ids := storetest.PagedRunIDs(t, s, 0, 1, 10); fmt.Sprint(ids) != "[run-c run-b run-a]" {
		t.Errorf("runs after migrating = %v, want [run-c run-b run-a]", ids)
	}
	if evs, err := s.Events(ctx, "run-a", 0); err != nil || len(evs) != 1 || evs[0].GetStage() != "intake" {
		t.Errorf("events of run-a = %v, %v", evs, err)
	}
	if w, err := s.WalletFor(ctx, "run-a", "job-run-a"); err != nil || w.GetHopsRemaining() != 2 {
		t.Errorf("wallet of run-a = %v, %v", w, err)
	}
	if got, created, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "run-z", JobId: "job-run-a", RequestId: "req-a"}); err != nil || created || got.GetRunId() != "run-a" {
		t.Errorf("request req-a again = %v, %v, %v; want run-a", got.GetRunId(), created, err)
	}
	if st, v, err := s.Lookup(ctx, "k"); err != nil || st != store.Done || string(v) != "done" {
		t.Errorf("idempotency record = %v %q %v", st, v, err)
	}
	if ttl := rdb.PTTL(ctx, prefix+"{k}:idem").Val(); ttl <= 0 {
		t.Errorf("idempotency record lost its expiry: ttl %v", ttl)
	}
	if ok, err := s.AcquireLease(ctx, "run:run-a", "coord-2", time.Minute); err != nil || ok {
		t.Errorf("lease held by coord-1 taken by coord-2 after migrating: %v, %v", ok, err)
	}
	if es, err := s.LedgerEntries(ctx); err != nil || len(es) != 1 || es[0].Key != "lk" {
		t.Errorf("ledger after migrating = %+v, %v", es, err)
	}
}
