package store

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// reclaim releases, when a bbolt file is opened, every run lease and every pending
// idempotency claim the file holds.
//
// Why that is safe: bbolt takes an exclusive flock on the file for as long as it is open
// (Open waits for it), so once Open has the lock no other live process has the file open,
// and a lease or a pending claim can only be held by a process that has it open. Whatever
// such record is in the file was left by an incarnation that is gone: a killed `handoff up`,
// or a store closed while a driver or a handler held it. Waiting for those records to lapse
// only delays the work they guard: the run's lease (LeaseTTL), the runner's stage claim
// (ClaimTTL), and above all the writeback's pending claim (PendingTTL, 2 minutes on
// `handoff up`), which held a crashed write's retry for that long.
//
// Releasing the writeback's pending claim means its retry writes again, at once, what the
// dead process may have written or may still have had on the wire (a webhook request sent
// before the kill). That is what the lapse of the claim would have allowed too, only later,
// and it is safe for the same reason: the retry re-sends the write under the same
// idempotency key, and the targets dedupe by it (the ledger upserts by key, and on this
// store writes its entry and the receipt in one transaction, so a retry after a committed
// write finds the receipt and does not write; a webhook's downstream honours
// Idempotency-Key). `handoff chaos --store bbolt` checks that no job is written twice
// across kills of the process at every crash point of a write.
//
// Completed records (receipts, stage results) are kept: they are the answers a retry
// must get. A run's fence epoch is kept too, so the next holder's FenceRun still moves it
// on.
func reclaim(db *bolt.DB, now time.Time) (leases, claims int, err error) {
	err = db.Update(func(tx *bolt.Tx) error {
		var err error
		if leases, err = deleteWhere(tx.Bucket(bucketLeases), func(_, _ []byte) bool { return true }); err != nil {
			return err
		}
		claims, err = deleteWhere(tx.Bucket(bucketIdem), func(_, v []byte) bool {
			st, _, live := decodeIdem(v, now)
			return live && st == Pending
		})
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("release the leases and claims of a process gone: %w", err)
	}
	return leases, claims, nil
}

// deleteWhere deletes the records of b (none when b is nil) that match and says how many.
// The keys are gathered first: bbolt does not allow deleting under ForEach.
func deleteWhere(b *bolt.Bucket, match func(k, v []byte) bool) (int, error) {
	if b == nil {
		return 0, nil
	}
	var keys [][]byte
	if err := b.ForEach(func(k, v []byte) error {
		if match(k, v) {
			keys = append(keys, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return 0, err
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}
