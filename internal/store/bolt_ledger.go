package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The ledger on bbolt: bucketLedger holds the entries (seq -> LedgerEntry as JSON, the id
// being ledger-%06d of seq), and bucketLedgerKeys indexes them by key for the upsert: key ->
// the key's entry's seq (8 bytes) and its offers (8 bytes). The index is made on the first
// ledger write of a file, from the entries already there, so a file written before the
// ledger upserted keeps each key's first entry as its entry.
var bucketLedgerKeys = []byte("ledgerkeys")

func encodeLedgerKey(seq, offers uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, seq)
	binary.BigEndian.PutUint64(b[8:], offers)
	return b
}

func decodeLedgerKey(b []byte) (seq, offers uint64, err error) {
	if len(b) != 16 {
		return 0, 0, fmt.Errorf("store: ledger index record of %d bytes, want 16", len(b))
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), nil
}

func ledgerID(seq int64) string { return fmt.Sprintf("ledger-%06d", seq) }

// ledgerIndex returns the key index, making it (from the entries there) when missing.
func ledgerIndex(tx *bolt.Tx) (*bolt.Bucket, error) {
	if b := tx.Bucket(bucketLedgerKeys); b != nil {
		return b, nil
	}
	idx, err := tx.CreateBucket(bucketLedgerKeys)
	if err != nil {
		return nil, err
	}
	err = tx.Bucket(bucketLedger).ForEach(func(k, v []byte) error {
		var e LedgerEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("store: decode ledger entry %d: %w", binary.BigEndian.Uint64(k), err)
		}
		seq, offers := binary.BigEndian.Uint64(k), uint64(0)
		if cur := idx.Get([]byte(e.Key)); cur != nil {
			if seq, offers, err = decodeLedgerKey(cur); err != nil {
				return err
			}
		}
		return idx.Put([]byte(e.Key), encodeLedgerKey(seq, offers+1)) // each old entry was an offer
	})
	return idx, err
}

// upsertLedger is AppendLedger inside tx.
func (s *Bolt) upsertLedger(tx *bolt.Tx, key string, payload []byte) (LedgerEntry, bool, error) {
	if key == "" {
		return LedgerEntry{}, false, fmt.Errorf("store: empty ledger key")
	}
	idx, err := ledgerIndex(tx)
	if err != nil {
		return LedgerEntry{}, false, err
	}
	entries := tx.Bucket(bucketLedger)
	if cur := idx.Get([]byte(key)); cur != nil {
		seq, offers, err := decodeLedgerKey(cur)
		if err != nil {
			return LedgerEntry{}, false, err
		}
		var e LedgerEntry
		if err := json.Unmarshal(entries.Get(u64(seq)), &e); err != nil {
			return LedgerEntry{}, false, fmt.Errorf("store: decode ledger entry %d of key %q: %w", seq, key, err)
		}
		e.Offers = int(offers + 1)
		return e, false, idx.Put([]byte(key), encodeLedgerKey(seq, offers+1))
	}
	seq, err := entries.NextSequence()
	if err != nil {
		return LedgerEntry{}, false, err
	}
	e := LedgerEntry{ID: ledgerID(int64(seq)), Key: key, Payload: append([]byte(nil), payload...), At: s.now().UTC(), Offers: 1}
	data, err := json.Marshal(e)
	if err != nil {
		return LedgerEntry{}, false, err
	}
	if err := entries.Put(u64(seq), data); err != nil {
		return LedgerEntry{}, false, err
	}
	return e, true, idx.Put([]byte(key), encodeLedgerKey(seq, 1))
}

func (s *Bolt) AppendLedger(_ context.Context, key string, payload []byte) (LedgerEntry, bool, error) {
	var e LedgerEntry
	var created bool
	err := s.update(func(tx *bolt.Tx) error {
		var err error
		e, created, err = s.upsertLedger(tx, key, payload)
		return err
	})
	if err != nil {
		return LedgerEntry{}, false, err
	}
	return e, created, nil
}

// AppendLedgerComplete is the upsert and the Complete in one write transaction.
// The claim is checked first, so a stale owner makes no entry either.
func (s *Bolt) AppendLedgerComplete(_ context.Context, key string, payload []byte, idemKey, owner string, ttl time.Duration, result func(LedgerEntry) ([]byte, error)) (LedgerEntry, bool, error) {
	if err := checkOwned("append ledger and complete", idemKey, owner); err != nil {
		return LedgerEntry{}, false, err
	}
	var e LedgerEntry
	var created bool
	err := s.update(func(tx *bolt.Tx) error {
		if st, _, mine := idemHeld(tx.Bucket(bucketIdem), idemKey, owner, s.now()); st == Pending && !mine {
			return fmt.Errorf("store: complete %q: %w", idemKey, ErrNotOwner)
		}
		var err error
		if e, created, err = s.upsertLedger(tx, key, payload); err != nil {
			return err
		}
		value, err := result(e)
		if err != nil {
			return err
		}
		if err := s.completeTx(tx, idemKey, owner, value, ttl); err != nil {
			return fmt.Errorf("store: complete %q: %w", idemKey, err)
		}
		return nil
	})
	if err != nil {
		return LedgerEntry{}, false, err
	}
	return e, created, nil
}

func (s *Bolt) LedgerEntries(context.Context) ([]LedgerEntry, error) {
	var out []LedgerEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		idx := tx.Bucket(bucketLedgerKeys) // nil until the first write made it
		return tx.Bucket(bucketLedger).ForEach(func(k, v []byte) error {
			var e LedgerEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			e.Offers = 1 // an entry of a file written before the index: one offer each
			if idx != nil {
				if cur := idx.Get([]byte(e.Key)); cur != nil {
					seq, offers, err := decodeLedgerKey(cur)
					if err != nil {
						return err
					}
					if seq == binary.BigEndian.Uint64(k) {
						e.Offers = int(offers)
					}
				}
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}
