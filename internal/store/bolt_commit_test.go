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

// txCount counts the write transactions update began.
func txCount(s *Bolt) int64 { return s.commit.txs.Load() }

// TestGroupCommit: writers that queue behind a running commit share one transaction; one
// that fails or panics gets its own error and takes nothing from the others; all the others'
// writes are durable when they return.
func TestGroupCommit(t *testing.T) {
	s := openTestBolt(t)
	bucket := []byte("t")
	if err := s.db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	put := func(k string) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(k), []byte("v")) }
	}

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
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		for i := range n {
			k := fmt.Sprintf("k%d", i)
			if has := b.Get([]byte(k)) != nil; has != (i != 5 && i != 9) {
				return fmt.Errorf("key %s present = %v", k, has)
			}
		}
		if b.Get([]byte("first")) == nil {
			return errors.New("the leader's own write is missing")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
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
