package store_test

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// oldLedger is a ledger written before it upserted: k1 twice, then k2.
var oldLedger = []string{
	`{"ID":"ledger-000001","Key":"k1","Payload":"Zmlyc3Q=","At":"2025-01-01T00:00:00Z"}`,
	`{"ID":"ledger-000002","Key":"k1","Payload":"c2Vjb25k","At":"2025-01-01T00:00:01Z"}`,
	`{"ID":"ledger-000003","Key":"k2","Payload":"dGhpcmQ=","At":"2025-01-01T00:00:02Z"}`,
}

// checkOldLedger: a ledger from before the upsert keeps every entry; each key's first
// entry becomes its entry (the old ones count as offers), and a new key gets the next id.
func checkOldLedger(t *testing.T, s store.Ledger) {
	t.Helper()
	ctx := context.Background()
	e, created, err := s.AppendLedger(ctx, "k1", []byte("again"))
	if err != nil || created || e.ID != "ledger-000001" || string(e.Payload) != "first" || e.Offers != 3 {
		t.Fatalf("AppendLedger(k1) over the old ledger = %+v, %v, %v; want ledger-000001 (first), not created, 3 offers", e, created, err)
	}
	e, created, err = s.AppendLedger(ctx, "k3", []byte("new"))
	if err != nil || !created || e.ID != "ledger-000004" {
		t.Fatalf("AppendLedger(k3) = %+v, %v, %v; want new entry ledger-000004", e, created, err)
	}
	es, err := s.LedgerEntries(ctx)
	if err != nil || len(es) != 4 {
		t.Fatalf("LedgerEntries = %+v, %v; want the 3 old entries and the new one", es, err)
	}
	for i, want := range []int{3, 1, 1, 1} {
		if es[i].Offers != want {
			t.Errorf("entry %s has %d offers, want %d", es[i].ID, es[i].Offers, want)
		}
	}
}

func TestBoltOldLedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handoff.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("ledger"))
		if err != nil {
			return err
		}
		for _, e := range oldLedger {
			seq, _ := b.NextSequence()
			k := binary.BigEndian.AppendUint64(nil, seq)
			if err := b.Put(k, []byte(e)); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkOldLedger(t, s)
}

func TestRedisOldLedger(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	rdb := storetest.RedisClient(t)
	for _, e := range []string{
		`{"key":"k1","payload":"Zmlyc3Q=","at":"2025-01-01T00:00:00Z"}`,
		`{"key":"k1","payload":"c2Vjb25k","at":"2025-01-01T00:00:01Z"}`,
		`{"key":"k2","payload":"dGhpcmQ=","at":"2025-01-01T00:00:02Z"}`,
	} {
		if err := rdb.RPush(context.Background(), prefix+"ledger", e).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := storetest.OpenRedisPrefix(t, prefix)
	if _, err := store.MigrateRedis(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	checkOldLedger(t, s)
}
