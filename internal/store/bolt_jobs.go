package store

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Buckets that keep job_id and request_id from being first-come, and wallets to their job.
// They came after the first release, so a store file may not have them yet: the first
// write that needs one creates it (writeBucket), and a read of a missing one finds nothing
// (getIn), which is what an older file means.
var (
	bucketWalletJobs  = []byte("walletjobs")  // wallet id -> job_id the wallet belongs to
	bucketJobSums     = []byte("jobsums")     // job_id -> JobDigest of its first run
	bucketRequestSums = []byte("requestsums") // request_id -> RequestDigest of its run
)

// getIn reads key from bucket name, nil when the bucket or the key is missing.
func getIn(tx *bolt.Tx, name []byte, key string) []byte {
	b := tx.Bucket(name)
	if b == nil {
		return nil
	}
	return b.Get([]byte(key))
}

// putIn writes key=value into bucket name, creating the bucket when missing.
func putIn(tx *bolt.Tx, name []byte, key, value string) error {
	b, err := tx.CreateBucketIfNotExists(name)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), []byte(value))
}

// walletJobOK checks, in tx, that wallet id records job (see Debit.Job): nil, ErrNotFound
// (no wallet id) or ErrWrongJob. An empty job is not checked.
func walletJobOK(tx *bolt.Tx, id, job string) error {
	if job == "" {
		return nil
	}
	if tx.Bucket(bucketWallets).Get([]byte(id)) == nil {
		return ErrNotFound
	}
	if string(getIn(tx, bucketWalletJobs, id)) != job {
		return ErrWrongJob
	}
	return nil
}

// checkSubmit is CreateRun's job_id rule in tx: ErrJobConflict when job's job_id was first
// created with other content (sum, its JobDigest).
func checkSubmit(tx *bolt.Tx, jobID, sum string) error {
	if jobID == "" {
		return nil
	}
	if prev := getIn(tx, bucketJobSums, jobID); prev != nil && string(prev) != sum {
		return fmt.Errorf("store: job %s: %w", jobID, ErrJobConflict)
	}
	return nil
}
