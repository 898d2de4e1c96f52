package writeback

import (
	"context"
	"errors"
	"fmt"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// Target is one external system the writeback service writes to. The service calls Write at
// most once per idempotency key at a time, and never again for a key whose receipt is stored;
// a Target may still see a key twice (after a Release on error, after a crash between its write
// and the receipt, after ReceiptTTL), so a Target that can should enforce WriteInput.Key itself
// (upsert, or pass it on as the Webhook does with its Idempotency-Key header).
type Target interface {
	// Name is the name a WriteRequest addresses the target by ("ledger", "webhook").
	Name() string
	// Write performs the external write and returns the external system's id for it.
	Write(ctx context.Context, w WriteInput) (externalID string, err error)
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

// Ledger is the target over the demo's external system, store.Ledger: each Write appends one
// entry (key, payload) and returns the entry's id.
//
// The ledger itself is append-only and not idempotent. Unless AppendOnly is set, Write first
// looks for an entry already appended under the same key and returns its id instead of
// appending again: that is what keeps a write that completed just before the writeback
// process died (entry appended, receipt never stored) from being appended a second time once
// the pending claim lapses. The lookup is a scan of the ledger, which is fine for the demo.
type Ledger struct {
	// Store is the ledger written to.
	Store store.Ledger
	// AppendOnly turns off the look-up of an earlier entry with the same key, so every call
	// appends. Tests use it to count exactly the writes the service let through.
	AppendOnly bool
}

// NewLedger returns the "ledger" target over l (with the same-key look-up on).
func NewLedger(l store.Ledger) *Ledger { return &Ledger{Store: l} }

// Name returns "ledger".
func (l *Ledger) Name() string { return LedgerName }

// Write appends w.Payload under w.Key and returns the ledger entry id.
func (l *Ledger) Write(ctx context.Context, w WriteInput) (string, error) {
	if l.Store == nil {
		return "", errors.New("ledger target: no ledger store")
	}
	if !l.AppendOnly {
		entries, err := l.Store.LedgerEntries(ctx)
		if err != nil {
			return "", fmt.Errorf("ledger: read entries: %w", err)
		}
		for _, e := range entries {
			if e.Key == w.Key {
				return e.ID, nil
			}
		}
	}
	e, _, err := l.Store.AppendLedger(ctx, w.Key, w.Payload)
	if err != nil {
		return "", fmt.Errorf("ledger: append %s: %w", w.Key, err)
	}
	return e.ID, nil
}
