package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// queued waits until n calls wait behind the running commit.
func queued(t *testing.T, s *Bolt, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.commit.mu.Lock()
		got := len(s.commit.queue)
		s.commit.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued after 10s, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func openTestBolt(t *testing.T) *Bolt {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "commit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testBucket makes bucket "t" in s and returns a write function putting key k in it and a
// check that k is on disk.
func testBucket(t *testing.T, s *Bolt) (put func(k string) func(*bolt.Tx) error, has func(k string) bool) {
	t.Helper()
	bucket := []byte("t")
	if err := s.db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	put = func(k string) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(k), []byte("v")) }
	}
	has = func(k string) bool {
		var ok bool
		s.db.View(func(tx *bolt.Tx) error { ok = tx.Bucket(bucket).Get([]byte(k)) != nil; return nil })
		return ok
	}
	return put, has
}

// txCount counts the write transactions update began.
func txCount(s *Bolt) int64 { return s.commit.txs.Load() }

// TestGroupCommit: writers that queue behind a running commit share one transaction; one
// that fails or panics gets its own error and takes nothing from the others; all the others'
// writes are durable when they return.
func TestGroupCommit(t *testing.T) {
	s := openTestBolt(t)
	put, has := testBucket(t, s)

	// The first writer holds the commit open until 20 others have queued behind it.
	release := make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- s.update(func(tx *bolt.Tx) error {
			<-release
			return put("first")(tx)
		})
	}()
	queued(t, s, 0)
	for {
		s.commit.mu.Lock()
		c := s.commit.committing
		s.commit.mu.Unlock()
		if c {
			break
		}
		time.Sleep(time.Millisecond)
	}

	boom := errors.New("boom")
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i {
			case 5:
				errs[i] = s.update(func(tx *bolt.Tx) error {
					if err := put("k5")(tx); err != nil {
						return err
					}
					return boom // its put must be rolled back
				})
			case 9:
				errs[i] = s.update(func(*bolt.Tx) error { panic("kaboom") })
			default:
				errs[i] = s.update(put(fmt.Sprintf("k%d", i)))
			}
		}()
	}
	queued(t, s, n)
	before := txCount(s)
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	for i, err := range errs {
		switch i {
		case 5:
			if !errors.Is(err, boom) {
				t.Errorf("call 5 = %v, want its own error", err)
			}
		case 9:
			if err == nil || !strings.Contains(err.Error(), "kaboom") {
				t.Errorf("call 9 = %v, want its panic as an error", err)
			}
		default:
			if err != nil {
				t.Errorf("call %d = %v", i, err)
			}
		}
	}
	// 20 queued writers: a shared attempt rolled back by the first failing call, that call
	// alone, a shared attempt rolled back by the other, that one alone, then the 18 others
	// together: 5 transactions (20 without group commit).
	if got := txCount(s) - before; got != 5 {
		t.Errorf("20 queued writers took %d write transactions; want 5", got)
	}
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		if got := has(k); got != (i != 5 && i != 9) {
			t.Fatalf("key %s present = %v", k, got)
		}
	}
	if !has("first") {
		t.Fatal("the leader's own write is missing")
	}
}

// TestCloseRefusesWrites: after Close, a write fails instead of blocking or panicking.
func TestCloseRefusesWrites(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "closed.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(*bolt.Tx) error { return nil }); !errors.Is(err, errClosed) {
		t.Fatalf("update after Close = %v, want errClosed", err)
	}
}

// TestLingerJoinsTheNextWrite: a lingering write waits for company: a plain write that
// comes within its linger leads one transaction for both; alone, it commits by itself once
// its linger passes; Close commits one still waiting at once. Every write is on disk when
// its call returns.
func TestLingerJoinsTheNextWrite(t *testing.T) {
	s := openTestBolt(t)
	put, has := testBucket(t, s)

	// Company: the lingering write is queued, not committed, until the plain write leads.
	before := txCount(s)
	lingered := make(chan error, 1)
	go func() { lingered <- s.updateLinger(time.Hour, put("event")) }()
	queued(t, s, 1)
	if txCount(s) != before || has("event") {
		t.Fatal("the lingering write committed on its own before its linger passed")
	}
	if err := s.update(put("admit")); err != nil {
		t.Fatal(err)
	}
	if err := <-lingered; err != nil {
		t.Fatal(err)
	}
	if n := txCount(s) - before; n != 1 || !has("event") || !has("admit") {
		t.Fatalf("%d transactions, event %v, admit %v; want both in 1", n, has("event"), has("admit"))
	}

	// Alone: it commits by itself once its linger has passed.
	before = txCount(s)
	if err := s.updateLinger(time.Millisecond, put("alone")); err != nil || !has("alone") || txCount(s)-before != 1 {
		t.Fatalf("alone: %v, on disk %v, %d transactions; want committed in 1", err, has("alone"), txCount(s)-before)
	}

	// Close does not wait out a linger, and does not drop the write.
	path := s.db.Path()
	go func() { lingered <- s.updateLinger(time.Hour, put("at-close")) }()
	queued(t, s, 1)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-lingered:
		if err != nil {
			t.Fatalf("lingering write at Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close left the lingering write waiting")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("t")).Get([]byte("at-close")) == nil {
			return errors.New("the write made at Close is not on disk")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
