package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// bucketLeases: lease name -> expiry (unix nanoseconds, big endian, 8 bytes) + owner. It is
// created on the first AcquireLease, so files made before leases existed need no migration.
var bucketLeases = []byte("leases")

func encodeLease(owner string, expires time.Time) []byte {
	b := make([]byte, 8+len(owner))
	binary.BigEndian.PutUint64(b, uint64(expires.UnixNano()))
	copy(b[8:], owner)
	return b
}

// decodeLease returns the lease's owner, or "" when there is none or it has expired.
func decodeLease(b []byte, now time.Time) string {
	if len(b) < 8 || now.UnixNano() >= int64(binary.BigEndian.Uint64(b[:8])) {
		return ""
	}
	return string(b[8:])
}

// AcquireLease runs in one write transaction, which bbolt serialises: that is what makes it
// exclusive between the goroutines of the one process that has the file open.
func (s *Bolt) AcquireLease(_ context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if err := checkLease(name, owner, ttl, true); err != nil {
		return false, err
	}
	ok := false
	err := s.update(func(tx *bolt.Tx) error {
		var err error
		ok, err = s.acquireLeaseTx(tx, name, owner, ttl)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store: acquire lease %s for %s: %w", name, owner, err)
	}
	return ok, nil
}

// acquireLeaseTx is AcquireLease in tx.
func (s *Bolt) acquireLeaseTx(tx *bolt.Tx, name, owner string, ttl time.Duration) (bool, error) {
	b, err := tx.CreateBucketIfNotExists(bucketLeases)
	if err != nil {
		return false, err
	}
	now := s.now()
	if holder := decodeLease(b.Get([]byte(name)), now); holder != "" && holder != owner {
		return false, nil
	}
	return true, b.Put([]byte(name), encodeLease(owner, now.Add(ttl)))
}

// AcquireLeaseFence takes the lease and, when it is held, the run's new epoch in one write
// transaction: one commit, and either both are durable or neither.
func (s *Bolt) AcquireLeaseFence(_ context.Context, name, owner string, ttl time.Duration, runID string) (bool, uint64, error) {
	if err := checkLease(name, owner, ttl, true); err != nil {
		return false, 0, err
	}
	if runID == "" {
		return false, 0, fmt.Errorf("store: fence run: run_id is empty")
	}
	ok, epoch := false, uint64(0)
	err := s.update(func(tx *bolt.Tx) error {
		var err error
		epoch = 0
		if ok, err = s.acquireLeaseTx(tx, name, owner, ttl); err != nil || !ok {
			return err
		}
		epoch, err = fenceRunTx(tx, runID)
		return err
	})
	if err != nil {
		return false, 0, fmt.Errorf("store: acquire lease %s for %s and fence run %s: %w", name, owner, runID, err)
	}
	return ok, epoch, nil
}

// CreateRunLeased takes the lease and the run's first epoch in CreateRun's write
// transaction: one commit for the three.
func (s *Bolt) CreateRunLeased(_ context.Context, job *handoffv1.Job, lease LeaseClaim, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, uint64, error) {
	return s.createRun(job, &lease, evs)
}

func (s *Bolt) ReleaseLease(_ context.Context, name, owner string) error {
	if err := checkLease(name, owner, 0, false); err != nil {
		return err
	}
	err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		if b == nil || decodeLease(b.Get([]byte(name)), s.now()) != owner {
			return nil
		}
		return b.Delete([]byte(name))
	})
	if err != nil {
		return fmt.Errorf("store: release lease %s for %s: %w", name, owner, err)
	}
	return nil
}

// LapsedLeases reads the leases bucket: on bbolt it holds only the leases of this file's one
// process, so a scan of it is cheap, and released leases are deleted from it.
func (s *Bolt) LapsedLeases(_ context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 100
	}
	var out []string
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		if b == nil {
			return nil
		}
		now := s.now()
		return b.ForEach(func(k, v []byte) error {
			if len(out) < limit && len(v) >= 8 && decodeLease(v, now) == "" {
				out = append(out, string(k))
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("store: lapsed leases: %w", err)
	}
	return out, nil
}

// bucketFences: run id -> its fence epoch (big endian uint64). Created on the first
// FenceRun, so older files need no migration.
var bucketFences = []byte("fences")

func fenceOf(tx *bolt.Tx, runID string) uint64 {
	b := tx.Bucket(bucketFences)
	if b == nil {
		return 0
	}
	v := b.Get([]byte(runID))
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func (s *Bolt) FenceRun(_ context.Context, runID string) (uint64, error) {
	if runID == "" {
		return 0, fmt.Errorf("store: fence run: run_id is empty")
	}
	var epoch uint64
	err := s.update(func(tx *bolt.Tx) error {
		var err error
		epoch, err = fenceRunTx(tx, runID)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: fence run %s: %w", runID, err)
	}
	return epoch, nil
}

// fenceRunTx is FenceRun in tx.
func fenceRunTx(tx *bolt.Tx, runID string) (uint64, error) {
	b, err := tx.CreateBucketIfNotExists(bucketFences)
	if err != nil {
		return 0, err
	}
	epoch := fenceOf(tx, runID) + 1
	return epoch, b.Put([]byte(runID), binary.BigEndian.AppendUint64(nil, epoch))
}

func (s *Bolt) FenceRunAt(_ context.Context, runID string, epoch uint64) error {
	if err := checkFenceAt(runID, epoch); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketFences)
		if err != nil {
			return err
		}
		switch cur := fenceOf(tx, runID); {
		case cur > epoch:
			return fmt.Errorf("store: fence run %s at epoch %d (the run's is %d): %w", runID, epoch, cur, ErrFenced)
		case cur == epoch:
			return nil
		}
		return b.Put([]byte(runID), binary.BigEndian.AppendUint64(nil, epoch))
	})
}

// PutRunFenced checks the fence in PutRun's write transaction.
func (s *Bolt) PutRunFenced(_ context.Context, job *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	return s.putRun(job, &epoch, evs)
}
