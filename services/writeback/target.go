package writeback

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// Target is one external system the writeback service writes to. The service calls Write at
// most once per idempotency key at a time, and never again for a key whose receipt is stored;
// a Target may still see a key twice (after a Release on error, after a crash between its write
// and the receipt, after ReceiptTTL), so a Target must enforce WriteInput.Key itself when it
// can: upsert, as the Ledger does, or pass it on, as the Webhook does with its
// Idempotency-Key header.
type Target interface {
	// Name is the name a WriteRequest addresses the target by ("ledger", "webhook").
	Name() string
	// Write performs the external write and returns the external system's id for it.
	Write(ctx context.Context, w WriteInput) (externalID string, err error)
}

// ReceiptTarget is a Target whose external system lives in the service's own idempotency
// store: the Ledger over the Store the service keeps its receipts in. For it the service
// closes the gap between a write and its receipt: WriteReceipt stores the receipt in the
// same transaction as the write, so whenever the process dies there is either both or
// neither, and a write retried after its claim lapsed finds its receipt.
type ReceiptTarget interface {
	Target
	// KeepsReceiptsIn reports whether st, the service's idempotency store, is the target's
	// own store, so that WriteReceipt can store receipts there.
	KeepsReceiptsIn(st store.Idempotency) bool
	// WriteReceipt performs the write as Write does and, in the same transaction, stores
	// receipt(externalID) as the completed result of idempotency key key under owner's
	// claim (as store.Idempotency.Complete does, kept for ttl; <= 0 forever): a claim that
	// is not owner's any more is store.ErrNotOwner, and the other owner's record is left as
	// it is. receipt may run more than once; an error from it aborts the write and is
	// returned.
	WriteReceipt(ctx context.Context, w WriteInput, key, owner string, ttl time.Duration, receipt func(externalID string) ([]byte, error)) (externalID string, err error)
}

// WriteInput is what a Target writes.
type WriteInput struct {
	// Key is the idempotency key, job_id:stage:artifact_type.
	Key string
	// JobID and Stage come from the package.
	JobID, Stage string
	// Artifact is the package's artifact being written (type, uri, sha256, ...).
	Artifact *handoffv1.Artifact
	// Payload is the artifact's bytes, read from the artifact store and checked against its
	// sha256 when the artifact records one.
	Payload []byte
	// Traceparent is the package's W3C traceparent ("" when the package had none).
	Traceparent string
}

// LedgerName is the Ledger target's name.
const LedgerName = "ledger"

// Ledger is the target over the demo's external system, store.Ledger, which enforces the
// key as a downstream system should: it upserts by key, so a write of a key that already
// has its entry (one made before a crash lost its receipt, or before the receipt expired)
// is answered with that entry's id and appends nothing. Over the service's own Store it is
// a ReceiptTarget: entry and receipt are one transaction (store.Ledger.AppendLedgerComplete).
type Ledger struct {
	// Store is the ledger written to.
	Store store.Ledger
}

var _ ReceiptTarget = (*Ledger)(nil)

// NewLedger returns the "ledger" target over l.
func NewLedger(l store.Ledger) *Ledger { return &Ledger{Store: l} }

// Name returns "ledger".
func (l *Ledger) Name() string { return LedgerName }

// Write upserts w.Payload under w.Key and returns the key's ledger entry id.
func (l *Ledger) Write(ctx context.Context, w WriteInput) (string, error) {
	if l.Store == nil {
		return "", errors.New("ledger target: no ledger store")
	}
	e, _, err := l.Store.AppendLedger(ctx, w.Key, w.Payload)
	if err != nil {
		return "", fmt.Errorf("ledger: append %s: %w", w.Key, err)
	}
	return e.ID, nil
}

// KeepsReceiptsIn reports whether st is the ledger's own store.
func (l *Ledger) KeepsReceiptsIn(st store.Idempotency) bool { return sameValue(l.Store, st) }

// WriteReceipt upserts w.Payload under w.Key and stores the receipt built from the key's
// entry id under key, in one store transaction.
func (l *Ledger) WriteReceipt(ctx context.Context, w WriteInput, key, owner string, ttl time.Duration, receipt func(string) ([]byte, error)) (string, error) {
	if l.Store == nil {
		return "", errors.New("ledger target: no ledger store")
	}
	e, _, err := l.Store.AppendLedgerComplete(ctx, w.Key, w.Payload, key, owner, ttl, func(e store.LedgerEntry) ([]byte, error) {
		return receipt(e.ID)
	})
	if err != nil {
		return "", fmt.Errorf("ledger: append %s with its receipt: %w", w.Key, err)
	}
	return e.ID, nil
}

// sameValue reports whether a and b are one value (one store behind two interfaces),
// without the panic == makes of two values of one uncomparable type.
func sameValue(a, b any) bool {
	if a == nil || b == nil {
		return false
	}
	t := reflect.TypeOf(a)
	return t == reflect.TypeOf(b) && t.Comparable() && a == b
}
