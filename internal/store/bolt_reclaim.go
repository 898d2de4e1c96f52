package store

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// reclaim releases, in the transaction that opens a bbolt file, every run lease and every
// pending idempotency claim the file holds.
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
func reclaim(tx *bolt.Tx, now time.Time) error {
	if err := deleteWhere(tx.Bucket(bucketLeases), func([]byte) bool { return true }); err != nil {
		return fmt.Errorf("release the leases of a process gone: %w", err)
	}
	if err := deleteWhere(tx.Bucket(bucketIdem), func(v []byte) bool {
		st, _, live := decodeIdem(v, now)
		return live && st == Pending
	}); err != nil {
		return fmt.Errorf("release the claims of a process gone: %w", err)
	}
	return nil
}

// deleteWhere deletes the records of b (none when b is nil) whose value matches. The keys
// are gathered first: bbolt does not allow deleting under ForEach.
func deleteWhere(b *bolt.Bucket, match func(v []byte) bool) error {
	if b == nil {
		return nil
	}
	var keys [][]byte
	if err := b.ForEach(func(k, v []byte) error {
		if match(v) {
			keys = append(keys, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
