package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/handoffhq/handoff/internal/store"
)

// renewer keeps the claims of the handlers in flight (WithClaimRenewal): one ticker per
// interceptor, every pendingTTL/3, renews every live claim, instead of a goroutine and a
// ticker per call. Most handlers end long before a tick, so most calls only join and leave
// the set; the ticker's goroutine runs while the set has claims and stops at the first tick
// that finds it empty.
//
// The rules are the per-call loop's: each claim is renewed within pendingTTL/3 of being
// taken and every pendingTTL/3 after (the first tick after its claim comes sooner than
// pendingTTL/3, never later); each renewal runs on its own goroutine, bounded by
// pendingTTL/3 and by pendingTTL/2 + pendingTTL/3 after the claim's last renewal, so a
// hung store call delays no other claim's renewal and cancels its handler before the claim
// can lapse; a claim whose renewal is out when a tick comes renews again as soon as it
// returns; the handler is cancelled when a renewal finds the key no longer pending or
// another owner's, or fails with the claim pendingTTL/2 past its last renewal.
type renewer struct {
	e *engine

	mu      sync.Mutex
	live    map[*liveClaim]struct{}
	running bool // the ticker's goroutine is running
}

// liveClaim is a claim whose handler runs.
type liveClaim struct {
	ctx                context.Context // the handler's context: its values go with the renewals
	lose               context.CancelCauseFunc
	method, key, owner string

	// Guarded by renewer.mu.
	last   time.Time     // when the claim was taken or last renewed
	busy   chan struct{} // while a renewal is out; closed when it returns
	missed bool          // a tick came while the renewal was out
}

func newRenewer(e *engine) *renewer {
	return &renewer{e: e, live: map[*liveClaim]struct{}{}}
}

// add puts c in the set, starting the ticker if it is not running.
func (r *renewer) add(c *liveClaim) {
	c.last = time.Now()
	r.mu.Lock()
	r.live[c] = struct{}{}
	if !r.running {
		r.running = true
		go r.loop()
	}
	r.mu.Unlock()
}

// remove takes c out of the set and waits for a renewal of it that is out, so no renewal of
// a claim runs after its handler's cancel returns.
func (r *renewer) remove(c *liveClaim) {
	r.mu.Lock()
	delete(r.live, c)
	busy := c.busy
	r.mu.Unlock()
	if busy != nil {
		<-busy
	}
}

func (r *renewer) loop() {
	every := r.e.pendingTTL / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for range tick.C {
		r.mu.Lock()
		if len(r.live) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		for c := range r.live {
			switch {
			case c.ctx.Err() != nil: // lost, or its handler is returning
			case c.busy != nil:
				// Its renewal is still out: it renews again as soon as it returns, as
				// a per-call ticker's buffered tick would.
				c.missed = true
			default:
				c.busy = make(chan struct{})
				go r.renew(c, c.busy)
			}
		}
		r.mu.Unlock()
	}
}

// renew renews c, again while ticks came during a renewal, and acts on each answer; busy
// is closed when it returns.
func (r *renewer) renew(c *liveClaim, busy chan struct{}) {
	defer close(busy)
	for r.renewOnce(c) {
		r.mu.Lock()
		again := c.missed && c.ctx.Err() == nil
		c.missed = false
		if !again {
			c.busy = nil
		}
		r.mu.Unlock()
		if !again {
			return
		}
	}
	r.mu.Lock()
	c.busy, c.missed = nil, false
	r.mu.Unlock()
}

// renewOnce renews c once and acts on the answer, as the per-call loop did: false when the
// claim is lost (its handler cancelled) or the handler is returning.
func (r *renewer) renewOnce(c *liveClaim) bool {
	e := r.e
	start := time.Now()
	r.mu.Lock()
	last := c.last // only this claim's renewal, which is this one, moves it
	r.mu.Unlock()
	// Bounded by pendingTTL/3, and never past pendingTTL/2 + pendingTTL/3 after the last
	// renewal: the shared ticker's first tick can come just after the claim, so a third
	// attempt can start near 2/3 of the TTL and, hanging its whole pendingTTL/3, would
	// return (and cancel the handler) only after the claim lapsed and another caller may
	// have taken the key. This bound cancels it with pendingTTL/6 to spare.
	deadline := start.Add(e.pendingTTL / 3)
	if d := last.Add(e.pendingTTL/2 + e.pendingTTL/3); d.Before(deadline) {
		deadline = d
	}
	cctx, cancel := context.WithDeadline(c.ctx, deadline)
	ok, err := e.st.RenewClaim(cctx, c.key, c.owner, e.pendingTTL)
	cancel()
	if c.ctx.Err() != nil {
		return false
	}
	if err == nil && ok {
		r.mu.Lock()
		c.last = start
		r.mu.Unlock()
	}
	switch {
	case err == nil && ok:
		return true
	case errors.Is(err, store.ErrNotOwner):
		// The claim lapsed and another caller holds the key: stop at once, so two
		// holders do not go on working together.
		e.log.ErrorContext(c.ctx, "idempotency: the claim lapsed and another caller holds the key; the handler's context is cancelled", "method", c.method, "key", c.key)
		c.lose(fmt.Errorf("%w: %v", errClaimLost, err))
	case err == nil:
		// Settled (the handler's own Complete or Release raced this tick) or lapsed:
		// either way nothing is left to keep.
		e.log.DebugContext(c.ctx, "idempotency: claim no longer pending; the handler's context is cancelled", "method", c.method, "key", c.key)
		c.lose(errClaimLost)
	case time.Since(last) >= e.pendingTTL/2:
		e.log.ErrorContext(c.ctx, "idempotency: claim not renewed in time; the handler's context is cancelled",
			"method", c.method, "key", c.key, "pending_ttl", e.pendingTTL, "error", err)
		c.lose(fmt.Errorf("%w: %v", errClaimLost, err))
	default:
		e.log.WarnContext(c.ctx, "idempotency: claim renewal failed; retrying", "method", c.method, "key", c.key, "error", err)
		return true
	}
	return false
}
