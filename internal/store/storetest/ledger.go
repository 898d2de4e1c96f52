package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/store"
)

// runLedger is the ledger's contract: it upserts by key, and AppendLedgerComplete writes the
// entry and the idempotency record built from it together.
func runLedger(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("Upsert", func(t *testing.T) { testLedgerUpsert(t, newStore(t)) })
	t.Run("ConcurrentUpsert", func(t *testing.T) { testLedgerConcurrentUpsert(t, newStore(t)) })
	t.Run("Complete", func(t *testing.T) { testLedgerComplete(t, newStore(t)) })
	t.Run("CompleteRefused", func(t *testing.T) { testLedgerCompleteRefused(t, newStore(t)) })
	t.Run("ConcurrentComplete", func(t *testing.T) { testLedgerConcurrentComplete(t, newStore(t)) })
}

// ledgerByKey returns the entries by key, failing on a key with two.
func ledgerByKey(t *testing.T, s store.Ledger) map[string]store.LedgerEntry {
	t.Helper()
	es, err := s.LedgerEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.LedgerEntry{}
	for _, e := range es {
		if prev, dup := out[e.Key]; dup {
			t.Fatalf("key %q has two entries, %s and %s", e.Key, prev.ID, e.ID)
		}
		out[e.Key] = e
	}
	return out
}

// testLedgerUpsert: the first append of a key makes its entry; a second returns it, writes
// no other and keeps the first payload, and is counted as an offer.
func testLedgerUpsert(t *testing.T, s store.Store) {
	ctx := context.Background()
	a, created, err := s.AppendLedger(ctx, "k1", []byte("one"))
	if err != nil || !created || a.ID == "" || a.Key != "k1" || string(a.Payload) != "one" || a.Offers != 1 || a.At.IsZero() {
		t.Fatalf("first AppendLedger = %+v, %v, %v; want a new entry, 1 offer", a, created, err)
	}
	b, created, err := s.AppendLedger(ctx, "k1", []byte("two"))
	if err != nil || created || b.ID != a.ID || string(b.Payload) != "one" || b.Offers != 2 || !b.At.Equal(a.At) {
		t.Fatalf("second AppendLedger of k1 = %+v, %v, %v; want the first entry %+v back, not created, 2 offers", b, created, err, a)
	}
	c, created, err := s.AppendLedger(ctx, "k2", []byte("three"))
	if err != nil || !created || c.ID == a.ID {
		t.Fatalf("AppendLedger of k2 = %+v, %v, %v; want an entry of its own", c, created, err)
	}
	es, err := s.LedgerEntries(ctx)
	if err != nil || len(es) != 2 {
		t.Fatalf("LedgerEntries = %+v, %v; want 2 entries", es, err)
	}
	if es[0].ID != a.ID || string(es[0].Payload) != "one" || es[0].Offers != 2 || es[1].ID != c.ID || es[1].Offers != 1 {
		t.Fatalf("LedgerEntries = %+v; want k1 (payload one, 2 offers) then k2 (1 offer)", es)
	}
	if _, _, err := s.AppendLedger(ctx, "", []byte("x")); err == nil {
		t.Fatal("AppendLedger with an empty key succeeded")
	}
}

// testLedgerConcurrentUpsert: 50 appends of one key at once make one entry; all of them get
// it back, and all are counted.
func testLedgerConcurrentUpsert(t *testing.T, s store.Store) {
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ids     = map[string]int{}
		created int
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, c, err := s.AppendLedger(context.Background(), "hot", fmt.Appendf(nil, "payload %d", i))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			ids[e.ID]++
			if c {
				created++
			}
		}()
	}
	wg.Wait()
	if created != 1 || len(ids) != 1 {
		t.Fatalf("%d concurrent appends of one key: %d made an entry, ids %v; want 1 and one id", n, created, ids)
	}
	if e := ledgerByKey(t, s)["hot"]; e.Offers != n {
		t.Fatalf("entry %+v; want %d offers", e, n)
	}
}

// receiptOf is the record the tests build from an entry.
func receiptOf(e store.LedgerEntry) ([]byte, error) { return []byte("receipt of " + e.ID), nil }

// testLedgerComplete: the entry and the record are written together, the record built from
// whichever entry the key has, and the record is a completed claim.
func testLedgerComplete(t *testing.T, s store.Store) {
	ctx := context.Background()
	st, _, owner, err := s.Claim(ctx, "w1", time.Minute)
	if err != nil || st != store.Claimed {
		t.Fatalf("Claim = %v, %v", st, err)
	}
	e, created, err := s.AppendLedgerComplete(ctx, "k1", []byte("one"), "w1", owner, 0, receiptOf)
	if err != nil || !created || e.Offers != 1 || string(e.Payload) != "one" {
		t.Fatalf("AppendLedgerComplete = %+v, %v, %v; want a new entry", e, created, err)
	}
	st, v, _, err := s.Claim(ctx, "w1", time.Minute)
	if err != nil || st != store.Done || string(v) != "receipt of "+e.ID {
		t.Fatalf("Claim after AppendLedgerComplete = %v, %q, %v; want done with the receipt of %s", st, v, err, e.ID)
	}
	if got := ledgerByKey(t, s)["k1"]; got.ID != e.ID {
		t.Fatalf("entry %+v; want %s", got, e.ID)
	}

	// A key that already has its entry (a writer died between its write and its record, or
	// the record expired): the record is built from that entry and nothing else is written.
	// (Its claim lapsed, so no claim holds w2: the writer completes it with its token.)
	old, _, err := s.AppendLedger(ctx, "k2", []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	e, created, err = s.AppendLedgerComplete(ctx, "k2", []byte("second"), "w2", "writer", 0, receiptOf)
	if err != nil || created || e.ID != old.ID || string(e.Payload) != "first" || e.Offers != 2 {
		t.Fatalf("AppendLedgerComplete of a written key = %+v, %v, %v; want %s back, not created, 2 offers", e, created, err, old.ID)
	}
	if st, v, _ := s.Lookup(ctx, "w2"); st != store.Done || string(v) != "receipt of "+old.ID {
		t.Fatalf("record = %v %q; want done with the receipt of %s", st, v, old.ID)
	}
	if n := len(ledgerByKey(t, s)); n != 2 {
		t.Fatalf("%d keys in the ledger, want 2", n)
	}

	// The record's ttl is Complete's.
	// 500ms: room for the write and the read after it on a loaded machine.
	if _, _, err := s.AppendLedgerComplete(ctx, "k3", []byte("x"), "w3", "writer", 500*time.Millisecond, receiptOf); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := s.Lookup(ctx, "w3"); st != store.Done {
		t.Fatalf("record w3 = %v right after, want done", st)
	}
	time.Sleep(700 * time.Millisecond)
	if st, _, _ := s.Lookup(ctx, "w3"); st != 0 {
		t.Fatalf("record w3 = %v after its ttl, want gone", st)
	}
	if _, ok := ledgerByKey(t, s)["k3"]; !ok {
		t.Fatal("the entry went with the record's ttl; it is kept")
	}
}

// testLedgerCompleteRefused: when the record cannot be built nothing is written.
func testLedgerCompleteRefused(t *testing.T, s store.Store) {
	ctx := context.Background()
	boom := errors.New("cannot build the receipt")
	_, _, err := s.AppendLedgerComplete(ctx, "k1", []byte("x"), "w1", "writer", 0, func(store.LedgerEntry) ([]byte, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("AppendLedgerComplete = %v; want the result's error", err)
	}
	if n := len(ledgerByKey(t, s)); n != 0 {
		t.Fatalf("%d entries after a refused AppendLedgerComplete, want 0", n)
	}
	if st, _, _ := s.Lookup(ctx, "w1"); st != 0 {
		t.Fatalf("record = %v after a refused AppendLedgerComplete, want none", st)
	}
	for _, c := range []struct{ key, idem, owner string }{{"", "w", "o"}, {"k", "", "o"}, {"k", "w", ""}} {
		if _, _, err := s.AppendLedgerComplete(ctx, c.key, []byte("x"), c.idem, c.owner, 0, receiptOf); err == nil {
			t.Errorf("AppendLedgerComplete(key %q, idempotency key %q, owner %q) succeeded", c.key, c.idem, c.owner)
		}
	}
}

// testLedgerConcurrentComplete: 40 writers, two per key, at once: each key gets one entry,
// and each record names its own key's entry (on Redis the entry's id is the server's to
// give, so racing writers must rebuild their record).
func testLedgerConcurrentComplete(t *testing.T, s store.Store) {
	const keys = 20
	var wg sync.WaitGroup
	for i := range 2 * keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("k%02d", i%keys)
			if _, _, err := s.AppendLedgerComplete(context.Background(), k, []byte(k), "w-"+k+fmt.Sprint(i/keys), "writer", 0, receiptOf); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	by := ledgerByKey(t, s)
	if len(by) != keys {
		t.Fatalf("%d keys in the ledger, want %d", len(by), keys)
	}
	for k, e := range by {
		if e.Offers != 2 || string(e.Payload) != k {
			t.Errorf("entry %+v; want payload %s, 2 offers", e, k)
		}
		for w := range 2 {
			if st, v, _ := s.Lookup(context.Background(), "w-"+k+fmt.Sprint(w)); st != store.Done || string(v) != "receipt of "+e.ID {
				t.Errorf("record of %s writer %d = %v %q; want the receipt of %s", k, w, st, v, e.ID)
			}
		}
	}
}
