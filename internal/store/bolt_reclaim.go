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
		leases, claims = 0, 0
		if b := tx.Bucket(bucketLeases); b != nil {
			var names [][]byte
			if err := b.ForEach(func(k, _ []byte) error {
				names = append(names, append([]byte(nil), k...))
				return nil
			}); err != nil {
				return err
			}
			for _, k := range names {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			leases = len(names)
		}
		b := tx.Bucket(bucketIdem)
		if b == nil {
			return nil
		}
		var pending [][]byte
		if err := b.ForEach(func(k, v []byte) error {
			if st, _, live := decodeIdem(v, now); live && st == Pending {
				pending = append(pending, append([]byte(nil), k...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range pending {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		claims = len(pending)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("release the leases and claims of a process gone: %w", err)
	}
	return leases, claims, nil
}
