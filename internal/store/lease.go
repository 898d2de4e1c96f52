package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Leases are named, expiring locks held by an owner: several processes that share a store
// use them so that exactly one of them does a piece of work at a time (the coordinator holds
// lease "run:<run_id>" while it drives that run).
//
// A lease alone is not a fence: a holder that stalls for longer than its ttl can still act
// after another owner took the lease over. Whoever holds a lease must therefore renew it well
// within the ttl, stop acting as soon as a renewal fails, and the work it guards must be
// safe to repeat (the platform's hops are, through their idempotency keys). What it saves
// is fenced (Fences): the owner that takes a run's lease takes a new epoch of the run, and
// a save made under an older epoch is refused, so a stalled holder cannot put an older
// state over a newer one.
type Leases interface {
	// AcquireLease takes lease name for owner for ttl when it is free or expired, or renews
	// it (a new ttl from now) when owner already holds it. It reports false, taking nothing,
	// while another owner holds it. ttl must be positive; expiry is measured by the store
	// (the Redis server's clock, the process clock for bbolt).
	AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error)
	// ReleaseLease frees lease name if owner holds it, so another owner can take it at once;
	// a lease held by someone else (or by nobody) is left as it is.
	ReleaseLease(ctx context.Context, name, owner string) error
	// LapsedLeases lists up to limit names of leases whose ttl has passed since their last
	// acquire or renewal and that nobody released: the leases of a holder that died. It is
	// cheap enough to poll several times a second (an index of expiries, not a scan of the
	// leases), so a lease is taken over when it lapses rather than on a slow scan. A name
	// may still be listed a moment after another owner took it again; AcquireLease decides.
	LapsedLeases(ctx context.Context, limit int) ([]string, error)
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

// ErrFenced is returned by PutRunFenced when the run's fence has moved past the epoch the
// save was made under: another holder took the run over, and nothing was written.
var ErrFenced = errors.New("the run was taken over under a newer epoch (stale save refused)")

// Fences are the epochs of runs, kept beside each run (in one transaction or script with
// its saves): a run's driver takes an epoch when it takes the run's lease, and saves with it.
type Fences interface {
	// FenceRun moves run's fence to a new epoch, greater than the run's fence (every epoch
	// it gave or FenceRunAt set for the run before), and returns it: from then on saves
	// under older epochs are refused. The run need not exist yet.
	FenceRun(ctx context.Context, runID string) (uint64, error)
	// FenceRunAt moves run's fence up to epoch, in one transaction or script of the run's:
	// how a nested run (a sub-job's) is fenced by the epoch of its parent's driver, handed
	// down, rather than by a lease of its own. A fence already at epoch is left as it is
	// (the same driver again); one past it is ErrFenced, changing nothing: a newer driver
	// of the parent holds the nested run. epoch must be positive; the run need not exist.
	FenceRunAt(ctx context.Context, runID string, epoch uint64) error
	// PutRunFenced is Runs.PutRun, refused with ErrFenced (nothing written) unless epoch is
	// the run's fence, checked in the same transaction as the write.
	PutRunFenced(ctx context.Context, job *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error
}

// LeaseFencer is implemented by stores that take a run's lease and then its new epoch with
// less work than AcquireLease followed by FenceRun (bbolt: in one transaction; Redis: the
// fence and the lease index in one round trip after the lease). Callers fall back to the
// two calls on a store without it.
type LeaseFencer interface {
	// AcquireLeaseFence is AcquireLease(name, owner, ttl) and, when owner holds the lease
	// afterwards, FenceRun(runID), in that order: held false means no lease and no new
	// epoch. An error with held true is a lease taken whose fence failed; the caller
	// releases it.
	AcquireLeaseFence(ctx context.Context, name, owner string, ttl time.Duration, runID string) (held bool, epoch uint64, err error)
}

// LeaseClaim is a lease to take: AcquireLease's arguments.
type LeaseClaim struct {
	Name, Owner string
	TTL         time.Duration
}

// RunLeaser is implemented by stores that can create a run and take its lease and first
// epoch in one write, where CreateRun then AcquireLeaseFence take two: on bbolt one
// transaction, so one commit (two fdatasyncs) fewer on every new job's path; on one Redis
// one script, so one round trip fewer. Redis Cluster holds the run's keys and the lease's in
// different slots, which no one script may span: there CreateRunLeased takes no lease
// (epoch 0) and its caller takes it as it would without a RunLeaser.
type RunLeaser interface {
	// CreateRunLeased is CreateRun(job, evs...), with the same checks, digests, conflicts
	// and answers, and, only when it creates the run, AcquireLease(lease) and
	// FenceRun(job.run_id) in the same write: either all of it is durable or none.
	// epoch is the run's first epoch, held by lease.Owner under lease.Name. It is 0 when
	// no lease was taken: the run was not created (the request's earlier run: created
	// false), or it was while another owner held lease.Name (neither lease nor epoch
	// taken, as AcquireLeaseFence's held false), or the store could not take it in the
	// same write (see above; on Redis, also a run created under the id an earlier
	// attempt of the request reserved, and one whose fence could not be raised: its
	// lease is then held, and the caller's AcquireLeaseFence renews it and reports the
	// fence's error). A run it creates holding the lease carries job.run_id, the
	// id the lease and the epoch are for. lease is checked as AcquireLease checks its
	// arguments, before anything is written.
	CreateRunLeased(ctx context.Context, job *handoffv1.Job, lease LeaseClaim, evs ...*handoffv1.JobEvent) (run *handoffv1.Job, created bool, epoch uint64, err error)
}

var (
	_ LeaseFencer = (*Bolt)(nil)
	_ LeaseFencer = (*Redis)(nil)
	_ RunLeaser   = (*Bolt)(nil)
	_ RunLeaser   = (*Redis)(nil)
)

// checkFenceAt checks FenceRunAt's arguments.
func checkFenceAt(runID string, epoch uint64) error {
	switch {
	case runID == "":
		return errors.New("store: fence run: run_id is empty")
	case epoch == 0:
		return fmt.Errorf("store: fence run %s: epoch 0 is no epoch (epochs start at 1)", runID)
	}
	return nil
}
