// Package idempotency makes gRPC methods run at most once per idempotency key, on a
// store.Idempotency (bbolt on one host, Redis across hosts). A repeat of a finished request
// gets the first answer back without running the handler again; a repeat of a request still
// in flight gets Aborted with a google.rpc.RetryInfo and then, on retry, the first answer.
//
// UnaryServerInterceptor serves unary methods registered with WithKey (the writeback's
// Write); StreamServerInterceptor serves server-streaming "ack first" methods registered with
// WithStreamKey (the agent runner's Deliver). Methods without a key pass through untouched.
//
// # Protocol
//
// For each keyed call: Claim(key, pendingTTL) in the store, then
//
//   - Done: the stored result is the answer (unary: unmarshalled into a new response and
//     passed to the WithReplay hook; stream: the one message WithStreamReplay builds). The
//     handler is not called.
//   - Pending: another call holds the key. Aborted, with a RetryInfo of the retry delay and
//     the message "request with idempotency key K is in flight; retry in 1s".
//   - Claimed: the handler runs. On success the result is stored under the key (Complete,
//     kept for the result TTL) before it is sent; on a handler error the key is released
//     (Release) and the error is returned unchanged, so a retry runs again. A handler whose
//     effect lives in the idempotency store itself stores the result in the same
//     transaction as the effect instead, and says so (ClaimFrom, Claim.Stored).
//
// A handler must therefore return an error only when it did no external effect: the
// interceptor releases the key on every error, and the retry runs the handler again.
//
// Each claim has an owner token (store.Idempotency), and the call's Complete, Release and
// renewals name it, checked in the store's own write. A call whose claim lapsed while
// another call claimed the key (its process stalled past the pending TTL) therefore settles
// nothing of the other call's: its release leaves the key alone, a renewal that finds the
// key another's cancels the handler at once, and its late result is refused, never stored
// over the other's; the call ends Aborted ("the claim of key K lapsed ..."), and a retry
// gets the key's result.
//
// # Failure behaviour
//
// Fail closed. When the store cannot be reached to Claim, the call fails with Unavailable
// ("idempotency store: ...") and the handler is not called: there is no write without its
// idempotency record.
//
// A result that cannot be stored (Complete fails, after a few attempts) means the work was
// done but nothing remembers it. The call fails with Unavailable (with a RetryInfo of the pending TTL), and the key is NOT released:
// releasing would let the caller's retry do the work a second time. The pending claim instead
// blocks repeats (Aborted) until the pending TTL lapses; after that a repeat runs again, and
// only an external system that enforces the key itself can then catch the duplicate.
//
// A handler that panics leaves its key claimed for the same reason (it may have panicked
// after its external write); the panic continues up the chain. Put a recovery interceptor
// inside this one (later in the chain) to turn panics into errors, which release the key.
//
// # Cancellation
//
// Once the key is claimed the handler runs with a context detached from the caller's
// cancellation and deadline (context.WithoutCancel, so its values such as metadata and the
// trace are kept) under a deadline of pendingTTL/2. A caller that hangs up mid-write
// therefore neither leaves a half-done write nor a claim that blocks its retry: the write
// finishes, its result is stored, and the retry gets it. The pendingTTL/2 deadline keeps the
// claim from lapsing (and a second caller from taking it) while its handler still runs.
// Claim, Complete and Release themselves run detached too, each bounded by 10s.
package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/store"
)

// storeTimeout bounds one Claim, Complete or Release, which run detached from the caller.
const storeTimeout = 10 * time.Second

// completeBackoff is the pause before each attempt of Complete: the work is done, so a
// transient store failure is worth a few attempts before the result is given up on.
var completeBackoff = []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond}

// UnaryServerInterceptor returns a unary interceptor that runs each method registered with
// WithKey at most once per key (see the package documentation for the protocol). It panics
// on a nil store or a misconfiguration (an option given twice, a replay without a key, a
// newResp of the wrong type).
func UnaryServerInterceptor(st store.Idempotency, opts ...Option) grpc.UnaryServerInterceptor {
	if st == nil {
		panic("idempotency: UnaryServerInterceptor: store is nil")
	}
	cfg := newUnaryConfig(opts)
	e := newEngine(st, cfg.common)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := cfg.methods[info.FullMethod]
		if !ok {
			return handler(ctx, req)
		}
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "idempotency: %s: request %T is not a protobuf message", info.FullMethod, req)
		}
		key, err := computeKey(m.key, msg)
		if err != nil {
			return nil, err
		}
		state, value, owner, err := e.claim(ctx, info.FullMethod, key)
		if err != nil {
			return nil, err
		}
		switch state {
		case store.Done:
			out := m.newResp()
			if err := proto.Unmarshal(value, out); err != nil {
				e.log.ErrorContext(ctx, "idempotency: stored result unreadable", "method", info.FullMethod, "key", key, "error", err)
				return nil, status.Errorf(codes.Internal, "idempotency: stored result for key %s is unreadable: %v", key, err)
			}
			if m.replay != nil {
				m.replay(out)
			}
			return out, nil
		case store.Pending:
			return nil, e.inFlight(key)
		}

		// Claimed: from here every path Completes, Releases, or deliberately leaves the claim.
		if err := ctx.Err(); err != nil { // the caller left before any work: free the key
			e.release(ctx, info.FullMethod, key, owner)
			return nil, status.FromContextError(err).Err()
		}
		crashpoint.Hit(crashpoint.AfterClaim, key)
		wctx, cancel := e.workContext(ctx, info.FullMethod, key, owner)
		defer cancel()
		held := &Claim{Key: key, Owner: owner, ResultTTL: e.resultTTL}
		wctx = withClaim(wctx, held)
		returned := false
		defer func() {
			if !returned {
				e.log.ErrorContext(ctx, "idempotency: handler panicked; its key stays claimed until the pending TTL lapses",
					"method", info.FullMethod, "key", key, "pending_ttl", e.pendingTTL)
			}
		}()
		resp, herr := handler(wctx, req)
		returned = true
		if herr != nil {
			e.release(ctx, info.FullMethod, key, owner)
			return resp, herr
		}
		if !held.stored.Load() { // else the handler stored it with its effect (Claim)
			out, ok := resp.(proto.Message)
			if !ok {
				err = fmt.Errorf("response %T is not a protobuf message", resp)
			} else {
				var data []byte
				if data, err = proto.Marshal(out); err == nil {
					err = e.complete(ctx, key, owner, data)
				}
			}
			if err != nil {
				return nil, e.notRecorded(ctx, info.FullMethod, key, err)
			}
		}
		crashpoint.Hit(crashpoint.AfterReceipt, key)
		return resp, nil
	}
}

// engine is the claim/complete/release protocol both interceptors share.
type engine struct {
	st store.Idempotency
	common
	renewals *renewer // the claims of the handlers in flight (WithClaimRenewal)
}

func newEngine(st store.Idempotency, c common) *engine {
	e := &engine{st: st, common: c}
	e.renewals = newRenewer(e)
	return e
}

// detached returns ctx without its cancellation and deadline, bounded by d. A ctx that can
// be neither cancelled nor run out (Done nil, no deadline: already detached, as the stream
// interceptor's calls are) is bounded as it is, without another layer.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// workContext is the context a handler holding key's claim runs under: detached, bounded
// by pendingTTL/2, or with WithClaimRenewal by its work limit while the engine's renewer
// keeps the claim. Its cancel also takes the claim out of the renewer, waiting for a
// renewal of it that is out.
func (e *engine) workContext(ctx context.Context, method, key, owner string) (context.Context, context.CancelFunc) {
	if e.renewFor <= 0 {
		return detached(ctx, e.pendingTTL/2)
	}
	wctx, cancel := detached(ctx, e.renewFor)
	rctx, lose := context.WithCancelCause(wctx)
	c := &liveClaim{ctx: rctx, lose: lose, method: method, key: key, owner: owner}
	e.renewals.add(c)
	return rctx, func() {
		lose(nil)
		e.renewals.remove(c)
		cancel()
	}
}

// errClaimLost cancels a handler whose claim could not be kept.
var errClaimLost = errors.New("idempotency: the claim could not be renewed; another caller may hold the key now")

// claim claims key and returns the claim's owner token. Its errors are gRPC statuses:
// Unavailable when the store failed.
func (e *engine) claim(ctx context.Context, method, key string) (store.ClaimState, []byte, string, error) {
	return e.claimWith(ctx, method, key, func(cctx context.Context) (store.ClaimState, []byte, string, error) {
		return e.st.Claim(cctx, key, e.pendingTTL)
	})
}

// claimWith is claim with fn in place of the store's Claim (WithStreamClaim).
func (e *engine) claimWith(ctx context.Context, method, key string, fn func(context.Context) (store.ClaimState, []byte, string, error)) (store.ClaimState, []byte, string, error) {
	cctx, cancel := detached(ctx, storeTimeout)
	defer cancel()
	state, value, owner, err := fn(cctx)
	if err != nil {
		e.log.ErrorContext(ctx, "idempotency: claim failed; request refused", "method", method, "key", key, "error", err)
		return 0, nil, "", status.Errorf(codes.Unavailable, "idempotency store: claim %s: %v", key, err)
	}
	switch {
	case state == store.Claimed && owner == "":
		// Fail closed: without its token the claim could be neither settled nor renewed.
		e.log.ErrorContext(ctx, "idempotency: claim returned no owner token", "method", method, "key", key)
		return 0, nil, "", status.Errorf(codes.Internal, "idempotency store: claim %s: claimed without an owner token", key)
	case state == store.Claimed, state == store.Pending, state == store.Done:
		return state, value, owner, nil
	}
	e.log.ErrorContext(ctx, "idempotency: claim returned an unknown state", "method", method, "key", key, "state", int(state))
	return 0, nil, "", status.Errorf(codes.Internal, "idempotency store: claim %s: unexpected state %d", key, state)
}

// complete stores value under owner's claim of key, retrying: after the work the record is
// the one thing that keeps a retry from doing it again. A claim that is not owner's any
// more (store.ErrNotOwner) is not retried: it will not become owner's again.
func (e *engine) complete(ctx context.Context, key, owner string, value []byte) error {
	var err error
	for _, pause := range completeBackoff {
		time.Sleep(pause)
		cctx, cancel := detached(ctx, storeTimeout)
		err = e.st.Complete(cctx, key, owner, value, e.resultTTL)
		cancel()
		if err == nil || errors.Is(err, store.ErrNotOwner) {
			return err
		}
	}
	return err
}

// release frees owner's claim of key after a failure. A failed release is logged: the key
// then stays claimed until the pending TTL lapses, which delays the retry but never doubles
// work; a claim that lapsed and is another caller's now is left to that caller.
func (e *engine) release(ctx context.Context, method, key, owner string) {
	rctx, cancel := detached(ctx, storeTimeout)
	defer cancel()
	err := e.st.Release(rctx, key, owner)
	if errors.Is(err, store.ErrNotOwner) {
		e.log.WarnContext(ctx, "idempotency: not released: the claim lapsed and another caller holds the key now", "method", method, "key", key)
		return
	}
	if err != nil {
		e.log.ErrorContext(ctx, "idempotency: release failed; the key stays claimed until the pending TTL lapses",
			"method", method, "key", key, "pending_ttl", e.pendingTTL, "error", err)
	}
}

// notRecorded is the answer when the work was done but its result could not be stored. The
// claim is deliberately left in place (see the package documentation). A claim that lapsed
// and is another caller's (store.ErrNotOwner) is Aborted: that caller's result, not this
// one's, is the key's, and a retry gets it (Aborted in flight until it is stored).
func (e *engine) notRecorded(ctx context.Context, method, key string, cause error) error {
	if errors.Is(cause, store.ErrNotOwner) {
		e.log.ErrorContext(ctx, "idempotency: request done but its claim lapsed and another caller holds the key; its result is not stored",
			"method", method, "key", key, "pending_ttl", e.pendingTTL, "error", cause)
		st := status.New(codes.Aborted, fmt.Sprintf(
			"idempotency: the claim of key %s lapsed while the request ran and another call holds the key now; this call's result was not stored: retry to get the key's result", key))
		if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.retryDelay)}); err == nil {
			st = d
		}
		return st.Err()
	}
	e.log.ErrorContext(ctx, "idempotency: request done but its result could not be stored; the key stays claimed until the pending TTL lapses",
		"method", method, "key", key, "pending_ttl", e.pendingTTL, "error", cause)
	// Unavailable, not Internal: the caller should come back. Until the pending TTL lapses a
	// repeat is refused as in flight; after it, the repeat runs again under the same key
	// (which the downstream system sees, e.g. as the webhook's Idempotency-Key).
	st := status.New(codes.Unavailable, fmt.Sprintf(
		"idempotency store: the request with idempotency key %s was done but its result could not be stored: %v; repeats are refused until %s after it started",
		key, cause, e.pendingTTL))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.pendingTTL)}); err == nil {
		st = d
	}
	return st.Err()
}

// inFlight is Aborted with a google.rpc.RetryInfo of the retry delay.
func (e *engine) inFlight(key string) error {
	st := status.New(codes.Aborted, fmt.Sprintf("request with idempotency key %s is in flight; retry in %s", key, e.retryDelay))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.retryDelay)}); err == nil {
		st = d
	}
	return st.Err()
}

// computeKey runs a key function: its error, or an empty key, is InvalidArgument.
func computeKey(fn func(proto.Message) (string, error), req proto.Message) (string, error) {
	key, err := fn(req)
	if err != nil {
		msg := err.Error()
		if s, ok := status.FromError(err); ok {
			msg = s.Message()
		}
		return "", status.Errorf(codes.InvalidArgument, "idempotency key: %s", msg)
	}
	if key == "" {
		return "", status.Error(codes.InvalidArgument, "idempotency key: empty")
	}
	return key, nil
}
