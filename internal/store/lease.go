package store

import (
	"context"
	"errors"
	"time"
)

// Leases are named, expiring locks held by an owner: several processes that share a store
// use them so that exactly one of them does a piece of work at a time (the coordinator holds
// lease "run:<run_id>" while it drives that run).
//
// A lease is not a fence: a holder that stalls for longer than its ttl can still act after
// another owner took the lease over. Whoever holds a lease must therefore renew it well
// within the ttl, stop acting as soon as a renewal fails, and the work it guards must be
// safe to repeat (the platform's hops are, through their idempotency keys).
type Leases interface {
	// AcquireLease takes lease name for owner for ttl when it is free or expired, or renews
	// it (a new ttl from now) when owner already holds it. It reports false, taking nothing,
	// while another owner holds it. ttl must be positive; expiry is measured by the store
	// (the Redis server's clock, the process clock for bbolt).
	AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error)
	// ReleaseLease frees lease name if owner holds it, so another owner can take it at once;
	// a lease held by someone else (or by nobody) is left as it is.
	ReleaseLease(ctx context.Context, name, owner string) error
}

// checkLease checks AcquireLease's and ReleaseLease's arguments.
func checkLease(name, owner string, ttl time.Duration, acquire bool) error {
	switch {
	case name == "":
		return errors.New("store: lease name is empty")
	case owner == "":
		return errors.New("store: lease owner is empty")
	case acquire && ttl <= 0:
		return errors.New("store: lease ttl must be positive")
	}
	return nil
}
