package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// Run leases. Several coordinator replicas share one store; each run is driven by the one
// replica that holds the run's lease "run:<run_id>" (store.Leases):
//
//   - SubmitJob takes the new run's lease and drives it at once (on a store.RunLeaser, in
//     the write that creates the run).
//   - A driver renews the lease in the background every LeaseTTL/3, and before a hop when
//     its last renewal is older than that;
//     when a renewal finds the lease taken, or none succeeds for LeaseTTL/2 (the store is
//     unreachable: from then on another replica may soon take the lease), the driver's
//     context is cancelled: it stops before its next hop, and a hop in flight is abandoned.
//   - A driver releases the lease when its run ends or Close drains it; a replica that dies
//     does not, and its leases expire LeaseTTL after their last renewal.
//   - Takeover when a lease lapses: from Resume on, every LeaseTTL/10 (at most 250ms) the
//     replica asks the store for lapsed leases (store.Leases.LapsedLeases: an index of
//     expiries, one round trip however many runs are held) and drives each such run whose
//     lease it can take. A dead replica's leases lapse between 2/3 and all of LeaseTTL
//     after it died (it renewed every LeaseTTL/3), so its runs resume on another replica
//     about 0.9*LeaseTTL after the kill: 1.4s at the default 1.5s. Runs that lost their
//     driver to a store outage lapse the same way and are picked up again when the store
//     is back.
//   - Resume also lists the RUNNING runs once, and again every 10*LeaseTTL (at least 10s),
//     and drives each whose lease it can take: the backstop for a lease the index does not
//     list (its holder died between taking it and indexing it, or a store written before
//     the index).
//
// The new driver loads the run as last saved, so the hop the dead replica had in flight is
// sent once more. That repeat is harmless: the agent runner answers it DUPLICATE (or
// Aborted while the first delivery still runs) from its completion key, and the writeback
// returns the first receipt from its idempotency key.
//
// The lease is also a fence: a driver takes a new epoch of the run (store.Fences) when it
// takes the lease, before it reads the run, and every save it makes carries that epoch, checked
// in the save's own transaction or script. A holder that stalled past its lease and saves
// after the takeover is refused (store.ErrFenced): it stops as if it had lost the lease, and
// the run never goes back to an older state.

var (
	errLeaseLost = errors.New("the run's lease was lost to another replica or could not be renewed")
	errStopping  = errors.New("coordinator is shutting down")
)

// epochKey carries a driver's fence epoch (store.Fences) in its context, for save.
type epochKey struct{}

func withEpoch(ctx context.Context, epoch uint64) context.Context {
	return context.WithValue(ctx, epochKey{}, epoch)
}

// epochOf is the fence epoch of the driver whose context ctx is, if any.
func epochOf(ctx context.Context) (uint64, bool) {
	e, ok := ctx.Value(epochKey{}).(uint64)
	return e, ok
}

// leaseTimeout bounds one lease call.
const leaseTimeout = 3 * time.Second

// leasePrefix starts the name of every run lease.
const leasePrefix = "run:"

func leaseName(runID string) string { return leasePrefix + runID }

// defaultOwner is hostname/pid/random: unique per process, readable in the store.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// lease is a run lease this replica holds.
type lease struct {
	s      *Server
	name   string
	lastOK atomic.Int64 // unix nanos at the start of the last successful acquire or renewal
}

// acquire takes (or renews) the lease; ok reports whether this replica holds it.
func (l *lease) acquire(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseTimeout)
	defer cancel()
	start := time.Now()
	ok, err := l.s.opts.Store.AcquireLease(ctx, l.name, l.s.opts.Owner, l.s.opts.LeaseTTL)
	if err == nil && ok {
		l.lastOK.Store(start.UnixNano())
	}
	return ok, err
}

// acquireFenced is acquire and, when the lease is held, the run's new epoch, in one call of
// a store that takes both at once (store.LeaseFencer).
func (l *lease) acquireFenced(ctx context.Context, lf store.LeaseFencer, runID string) (bool, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseTimeout)
	defer cancel()
	start := time.Now()
	ok, epoch, err := lf.AcquireLeaseFence(ctx, l.name, l.s.opts.Owner, l.s.opts.LeaseTTL, runID)
	if ok {
		l.lastOK.Store(start.UnixNano())
	}
	return ok, epoch, err
}

// renew is acquire before a hop, skipped while the last renewal is younger than LeaseTTL/3:
// the lease then has at least 2/3 of its TTL left, no other replica can take it before it
// expires, and keep renews it in the background at that same pace. A driver doing many
// short hops so renews about as often as keep does, not once per hop.
func (l *lease) renew(ctx context.Context) (bool, error) {
	if time.Since(time.Unix(0, l.lastOK.Load())) < l.s.opts.LeaseTTL/3 {
		return true, nil
	}
	return l.acquire(ctx)
}

// keep renews the lease every LeaseTTL/3 until ctx ends, and cancels the driver (lose) when
// the lease is taken or has gone LeaseTTL/2 without a successful renewal.
func (l *lease) keep(ctx context.Context, lose context.CancelCauseFunc, runID string) {
	ttl := l.s.opts.LeaseTTL
	tick := time.NewTicker(ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ok, err := l.acquire(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil && !ok {
			l.s.log.Warn("run lease taken by another replica; this driver stops", "run_id", runID, "owner", l.s.opts.Owner)
			lose(errLeaseLost)
			return
		}
		if err != nil {
			since := time.Since(time.Unix(0, l.lastOK.Load()))
			if since >= ttl/2 {
				l.s.log.Warn("run lease not renewed in time; this driver stops and the run is picked up again when the store answers",
					"run_id", runID, "since_last_renewal", since.Round(time.Millisecond).String(), "lease_ttl", ttl.String(), "err", err)
				lose(fmt.Errorf("%w: no renewal for %s: %v", errLeaseLost, since.Round(time.Millisecond), err))
				return
			}
			l.s.log.Warn("run lease renewal failed; retrying", "run_id", runID, "err", err)
		}
	}
}

// drive starts a driver for the run when this replica can take its lease and has no driver
// for it yet. It reports whether a driver was started. start, when not nil, is the run as
// its caller just wrote it, with its wallet (SubmitJob): the driver begins from it instead
// of reading both. The driver owns it from then on.
func (s *Server) drive(ctx context.Context, runID string, start *handoffv1.Job) (bool, error) {
	if s.stopped() || !s.reserve(runID) {
		return false, nil
	}
	l := &lease{s: s, name: leaseName(runID)}
	// A run just created (start) is no nested run, so its new epoch can be taken with the
	// lease, in one write, where the store can (the lease still first: no epoch without it).
	var epoch uint64
	var ok bool
	var err error
	if lf, fenced := s.opts.Store.(store.LeaseFencer); fenced && start != nil {
		ok, epoch, err = l.acquireFenced(ctx, lf, runID)
		if err != nil && ok { // the lease without its epoch: given back, as when FenceRun fails
			err = errors.Join(fmt.Errorf("fence run %s: %w", runID, err), l.giveBack(ctx))
		}
	} else {
		ok, err = l.acquire(ctx)
	}
	if err != nil || !ok {
		s.unreserve(runID)
		return false, err
	}
	return s.launch(ctx, runID, l, epoch, start)
}

// driveLeased starts the driver of a run its caller just created together with the run's
// lease and its first epoch (store.RunLeaser), in a write begun at took: the driver holds
// them from then on, as drive's would after taking them. It reports whether a driver was
// started. When none is, the lease is given back (shutting down), or left to whatever of
// this replica reserved the run first (a scan, the lapsed-lease watch, an operator's hold in
// resolve.go): the lease is this replica's, so that one renews it, drives under a newer
// epoch or releases it, as it would have had the run been created without its lease.
func (s *Server) driveLeased(ctx context.Context, runID string, epoch uint64, took time.Time, start *handoffv1.Job) (bool, error) {
	if !s.reserve(runID) { // something of this replica found the new run first
		return false, nil
	}
	l := &lease{s: s, name: leaseName(runID)}
	l.lastOK.Store(took.UnixNano())
	return s.launch(ctx, runID, l, epoch, start)
}

// reserve marks runID as driven here, while its lease is tried and then for as long as its
// driver runs; false when it already is.
func (s *Server) reserve(runID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.driving[runID] {
		return false
	}
	s.driving[runID] = true
	return true
}

func (s *Server) unreserve(runID string) {
	s.mu.Lock()
	delete(s.driving, runID)
	s.mu.Unlock()
}

// giveBack releases the lease, when its holder is done with it, bounded by leaseTimeout
// and not by ctx, which may have ended already (the caller cancelled, the server closing).
func (l *lease) giveBack(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseTimeout)
	defer cancel()
	return l.s.opts.Store.ReleaseLease(rctx, l.name, l.s.opts.Owner)
}

// launch starts the driver of a run reserved for it (reserve) whose lease l holds: under
// epoch, or, when epoch is 0 (epochs start at 1), under one it takes now. Shutting down, it
// gives the lease back instead; either way the reservation is its.
func (s *Server) launch(ctx context.Context, runID string, l *lease, epoch uint64, start *handoffv1.Job) (bool, error) {
	// Close closes stopping under mu, so this Add either comes before its Wait or not at all.
	s.mu.Lock()
	if s.stopped() {
		s.mu.Unlock()
		s.unreserve(runID)
		return false, l.giveBack(ctx)
	}
	s.wg.Add(1)
	s.mu.Unlock()
	// The run's new epoch, taken while holding its lease and before reading the run: from
	// now on a save by an earlier holder is refused, so what this driver reads next is the
	// run's last state for good.
	if epoch == 0 {
		var err error
		if epoch, err = s.fence(ctx, runID, start == nil); err != nil {
			s.wg.Done()
			s.unreserve(runID)
			if err == errNested { // not this driver's to drive: no error
				err = nil
			}
			return false, errors.Join(err, l.giveBack(ctx))
		}
	}
	go func() {
		defer s.wg.Done()
		defer s.unreserve(runID)
		defer s.unkeepFeed(runID) // the feed SubmitJob kept for its first watch, if it did
		dctx, lose := context.WithCancelCause(withEpoch(s.ctx, epoch))
		defer lose(nil)
		kept := make(chan struct{})
		go func() { defer close(kept); l.keep(dctx, lose, runID) }()
		err := s.run(dctx, runID, l, start)
		// Events of a hop whose state was never saved: whoever drives the run next repeats
		// that hop from the last saved state and records it again.
		s.dropUnsaved(runID, "driver stopped")
		lost := errors.Is(context.Cause(dctx), errLeaseLost) || errors.Is(err, errLeaseLost)
		lose(nil)
		<-kept
		switch {
		case err == nil, errors.Is(err, errStopping):
		case lost:
			s.log.Info("driver stopped: run lease lost", "run_id", runID, "err", err)
		case s.ctx.Err() == nil:
			s.log.Error("driver stopped", "run_id", runID, "err", err)
		}
		if !lost {
			// Ended, drained or cancelled: free the run for another replica now.
			if err := l.giveBack(s.ctx); err != nil {
				s.log.Warn("release run lease (it expires by itself)", "run_id", runID, "err", err)
			}
		}
	}()
	return true, nil
}

// errNested: fence refused a nested run.
var errNested = errors.New("a nested run is fenced by its parent's driver")

// fence takes the run's new epoch for its driver. With read (a run its caller did not just
// create) the run is read first, and a nested run is refused with errNested: it is fenced
// by its parent's driver (subjob.go), never on its own, and a FenceRun here would refuse
// that driver's saves. The scan skips nested runs; this covers a lapsed lease of one (taken
// by an older release).
func (s *Server) fence(ctx context.Context, runID string, read bool) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseTimeout)
	defer cancel()
	if read {
		j, err := s.opts.Store.GetRun(ctx, runID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return 0, fmt.Errorf("read run %s: %w", runID, err)
		}
		if err == nil && j.GetParentRunId() != "" {
			return 0, errNested
		}
	}
	epoch, err := s.opts.Store.FenceRun(ctx, runID)
	if err != nil {
		return 0, fmt.Errorf("fence run %s: %w", runID, err)
	}
	return epoch, nil
}

// Resume drives every RUNNING run whose lease this replica can take, and from then on
// watches for lapsed leases every watchEvery and scans for such runs every scanEvery until
// Close (the takeover of a dead replica's runs). It returns how many drivers the first scan
// started.
func (s *Server) Resume(ctx context.Context) (int, error) {
	n, err := s.scan(ctx)
	s.scanOnce.Do(func() {
		s.wg.Add(2)
		go s.takeover()
		go s.watch()
	})
	return n, err
}

// every calls f every d until Close.
func (s *Server) every(d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		f()
	}
}

func (s *Server) takeover() {
	defer s.wg.Done()
	s.every(s.scanEvery, func() {
		ctx, cancel := context.WithTimeout(s.ctx, max(s.scanEvery, 5*time.Second))
		n, err := s.scan(ctx)
		cancel()
		if err != nil {
			s.log.Warn("takeover scan failed; next scan in "+s.scanEvery.String(), "err", err)
		} else if n > 0 {
			s.log.Info("took over runs (scan)", "runs", n, "owner", s.opts.Owner)
		}
	})
}

// watch takes over the runs whose leases lapsed, as soon as the store lists them.
func (s *Server) watch() {
	defer s.wg.Done()
	failing := false
	s.every(s.watchEvery, func() {
		ctx, cancel := context.WithTimeout(s.ctx, leaseTimeout)
		defer cancel()
		names, err := s.opts.Store.LapsedLeases(ctx, 200)
		if err != nil {
			if !failing { // once per outage, not every poll
				s.log.Warn("lapsed-lease watch failed; retrying", "every", s.watchEvery.String(), "err", err)
			}
			failing = true
			return
		}
		failing = false
		n := 0
		for _, name := range names {
			runID, ok := strings.CutPrefix(name, leasePrefix)
			if !ok || s.stopped() {
				continue
			}
			started, err := s.drive(ctx, runID, nil)
			if err != nil {
				s.log.Warn("take over a lapsed run lease", "run_id", runID, "err", err)
				continue
			}
			if started {
				n++
			}
		}
		if n > 0 {
			s.log.Info("took over runs whose lease lapsed", "runs", n, "owner", s.opts.Owner)
		}
	})
}

// scan starts a driver for each RUNNING run not driven here whose lease is free.
func (s *Server) scan(ctx context.Context) (int, error) {
	n, token := 0, ""
	for {
		runs, next, err := s.opts.Store.ListRuns(ctx, handoffv1.JobState_JOB_STATE_RUNNING, 200, token)
		if err != nil {
			return n, fmt.Errorf("list running runs: %w", err)
		}
		for _, r := range runs {
			if s.stopped() {
				return n, nil
			}
			if r.GetParentRunId() != "" { // a nested run: its parent's driver drives it (subjob.go)
				continue
			}
			s.mu.Lock()
			mine := s.driving[r.GetRunId()]
			s.mu.Unlock()
			if mine {
				continue
			}
			started, err := s.drive(ctx, r.GetRunId(), nil)
			if err != nil {
				return n, fmt.Errorf("take the lease of run %s: %w", r.GetRunId(), err)
			}
			if started {
				n++
			}
		}
		if next == "" {
			return n, nil
		}
		token = next
	}
}
