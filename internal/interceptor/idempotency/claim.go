package idempotency

import (
	"context"
	"sync/atomic"
	"time"
)

// Claim is the claim a keyed unary call's handler runs under: ClaimFrom finds it in the
// handler's context.
//
// It is for a handler whose effect lives in the idempotency store itself, such as the
// writeback's ledger on the service's own store. Stored separately, the effect and the
// result that answers its repeats leave a gap: a crash between them leaves the effect
// without its record, and once the pending claim lapses a retry does it again. Such a
// handler stores the result itself, in the same transaction as the effect: the bytes of
// proto.Marshal of the response it will return, under Key, kept for ResultTTL, as Complete
// would. Then it calls Stored, and the interceptor does not store the result again.
type Claim struct {
	// Key is the idempotency key the call holds.
	Key string
	// Owner is the claim's owner token (store.Idempotency), which the handler's own store
	// write names: a claim that lapsed and is another call's by then is refused
	// (store.ErrNotOwner), and that call's record is left as it is.
	Owner string
	// ResultTTL is how long the result is to be kept (WithResultTTL; 0 keeps it forever).
	ResultTTL time.Duration

	stored atomic.Bool
}

// Stored tells the interceptor that the handler has stored its result under the key.
func (c *Claim) Stored() { c.stored.Store(true) }

type claimKey struct{}

// ClaimFrom returns the claim the call's handler runs under; false outside a keyed unary
// call of UnaryServerInterceptor.
func ClaimFrom(ctx context.Context) (*Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(*Claim)
	return c, ok
}

func withClaim(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}
