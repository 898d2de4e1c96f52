package store_test

// Stores written before wallets recorded their job and runs their content digests: what
// such records mean to this version (see store.Wallets.OpenWallet, store.Runs.CreateRun).

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

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
