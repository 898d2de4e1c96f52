package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The ledger on Redis (see the key layout in redis.go), all in the slot of the hash tag
// {ledger}: the list "{ledger}:entries" holds the entries in order, "{ledger}:keys" maps each
// key to its entry's number (its place in the list, from 1) and "{ledger}:offers" counts the
// appends that named it. Both writes are scripts, so an
// upsert from any process sees every other one.

// ledgerRecord is a ledger entry as stored; its ID comes from its position in the list.
type ledgerRecord struct {
	Key     string    `json:"key"`
	Payload []byte    `json:"payload"`
	At      time.Time `json:"at"`
}

// ledgerLua defines index(list, keys, offers), run first by each ledger script: it makes
// the key index from the entries when there is none yet (a ledger written before it
// upserted keeps each key's first entry as its entry, each old entry counting as an offer).
const ledgerLua = `
local function index(list, keys, offers)
  if redis.call('EXISTS', keys) == 1 or redis.call('LLEN', list) == 0 then return end
  for i, e in ipairs(redis.call('LRANGE', list, 0, -1)) do
    local k = cjson.decode(e).key
    redis.call('HSETNX', keys, k, i)
    redis.call('HINCRBY', offers, k, 1)
  end
end
index(KEYS[1], KEYS[2], KEYS[3])
`

// appendLedgerScript upserts an entry. KEYS: ledger, ledger:keys, ledger:offers. ARGV: key,
// entry JSON. Reply: {"new", number} or {"old", number, offers, entry JSON}.
var appendLedgerScript = redis.NewScript(ledgerLua + `
local seq = redis.call('HGET', KEYS[2], ARGV[1])
if seq then
  local n = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
  return {'old', seq, tostring(n), redis.call('LINDEX', KEYS[1], tonumber(seq) - 1)}
end
local n = redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], n)
redis.call('HSET', KEYS[3], ARGV[1], 1)
return {'new', tostring(n)}
`)

// appendLedgerCompleteScript upserts an entry and stores the idempotency record built from
// it, provided the entry is the one the record was built for: number ARGV[3], an existing
// entry of the key or the next one. Otherwise it writes nothing (but the index) and replies
// what the entry would be now, for the caller to build the record again: {"moved", number,
// entry JSON} for an existing entry, {"moved", "0", list length} for a new one.
// Without KEYS[4] (on Redis Cluster, where the record is in its key's slot, not the
// ledger's) it writes the entry only, and AppendLedgerComplete stores the record next.
// With KEYS[4] the record's owner is checked first (heldLua): another owner's claim, or (in
// a round that writes, ARGV[3] set) a record done with another value, writes nothing and
// replies {"notowner"}; a record done with this one already writes the entry's offer only.
// KEYS: ledger, ledger:keys, ledger:offers[, idem]. ARGV: key, entry JSON, number, record,
// ttl ms (0: no expiry), owner. Reply: {"ok", "1" when made, offers}.
var appendLedgerCompleteScript = redis.NewScript(ledgerLua + heldLua + `
local h = 'free'
if KEYS[4] then
  h = held(KEYS[4], ARGV[6], ARGV[4])
  if h == 'other' or (h == 'done' and ARGV[3] ~= '') then return {'notowner'} end
end
local seq = redis.call('HGET', KEYS[2], ARGV[1])
local created, offers
if seq then
  if seq ~= ARGV[3] then return {'moved', seq, redis.call('LINDEX', KEYS[1], tonumber(seq) - 1)} end
  offers, created = redis.call('HINCRBY', KEYS[3], ARGV[1], 1), '0'
else
  local n = redis.call('LLEN', KEYS[1])
  if tostring(n + 1) ~= ARGV[3] then return {'moved', '0', tostring(n)} end
  redis.call('RPUSH', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[1], 1)
  offers, created = 1, '1'
end
if not KEYS[4] or h == 'same' then
elseif tonumber(ARGV[5]) > 0 then
  redis.call('SET', KEYS[4], ARGV[4], 'PX', ARGV[5])
else
  redis.call('SET', KEYS[4], ARGV[4])
end
return {'ok', created, tostring(offers)}
`)

func (s *Redis) ledgerKeys() []string {
	return []string{s.key("entries", "ledger"), s.key("keys", "ledger"), s.key("offers", "ledger")}
}

// encodeLedger is a new entry for key as the list stores it.
func (s *Redis) encodeLedger(key string, payload []byte) (LedgerEntry, []byte, error) {
	e := LedgerEntry{Key: key, Payload: append([]byte(nil), payload...), At: s.now().UTC(), Offers: 1}
	data, err := json.Marshal(ledgerRecord{Key: e.Key, Payload: e.Payload, At: e.At})
	if err != nil {
		return LedgerEntry{}, nil, fmt.Errorf("store: encode ledger entry: %w", err)
	}
	return e, data, nil
}

// decodeLedger reads entry number seq as the list stores it.
func decodeLedger(seq int64, data string) (LedgerEntry, error) {
	var rec ledgerRecord
	if err := json.Unmarshal([]byte(data), &rec); err != nil {
		return LedgerEntry{}, fmt.Errorf("store: decode ledger entry %d: %w", seq, err)
	}
	return LedgerEntry{ID: ledgerID(seq), Key: rec.Key, Payload: rec.Payload, At: rec.At, Offers: 1}, nil
}

func (s *Redis) AppendLedger(ctx context.Context, key string, payload []byte) (LedgerEntry, bool, error) {
	if key == "" {
		return LedgerEntry{}, false, fmt.Errorf("store: empty ledger key")
	}
	e, data, err := s.encodeLedger(key, payload)
	if err != nil {
		return LedgerEntry{}, false, err
	}
	var res []string
	err = s.replicated(ctx, s.ledgerKeys()[0], func(c redis.Cmdable) error {
		res, err = appendLedgerScript.Run(ctx, c, s.ledgerKeys(), key, data).StringSlice()
		return err
	})
	if err != nil {
		return LedgerEntry{}, false, s.errf("append ledger %q: %w", key, err)
	}
	switch {
	case len(res) == 2 && res[0] == "new":
		n, err := strconv.ParseInt(res[1], 10, 64)
		if err != nil {
			break
		}
		e.ID = ledgerID(n)
		return e, true, nil
	case len(res) == 4 && res[0] == "old":
		n, err1 := strconv.ParseInt(res[1], 10, 64)
		offers, err2 := strconv.Atoi(res[2])
		if err1 != nil || err2 != nil {
			break
		}
		old, err := decodeLedger(n, res[3])
		if err != nil {
			return LedgerEntry{}, false, err
		}
		old.Offers = offers
		return old, false, nil
	}
	return LedgerEntry{}, false, s.errf("append ledger %q: unexpected script reply %q", key, res)
}

// maxLedgerRounds bounds AppendLedgerComplete's rounds: each one that does not write lost a
// race to another writer's entry, so it takes about as many as there are concurrent writers.
const maxLedgerRounds = 1000

// AppendLedgerComplete runs appendLedgerCompleteScript until the entry it built the record
// for is still the one to write. The first round only learns what the entry would be (the
// key's, or the next number), since the record names the entry's id and the id is the
// server's to give; a later round writes unless another writer's entry came first.
//
// On Redis Cluster the record is read before the upsert, so a stale owner seen then (the
// key pending under another owner, or done) makes no entry; the Complete after it checks
// the owner again in the record's own script.
func (s *Redis) AppendLedgerComplete(ctx context.Context, key string, payload []byte, idemKey, owner string, ttl time.Duration, result func(LedgerEntry) ([]byte, error)) (LedgerEntry, bool, error) {
	if key == "" {
		return LedgerEntry{}, false, fmt.Errorf("store: empty ledger key")
	}
	if err := checkOwned("append ledger and complete", idemKey, owner); err != nil {
		return LedgerEntry{}, false, err
	}
	fresh, data, err := s.encodeLedger(key, payload)
	if err != nil {
		return LedgerEntry{}, false, err
	}
	keys := s.ledgerKeys()
	if !s.cluster {
		keys = append(keys, s.key("idem", idemKey))
	}
	fail := func(err error) (LedgerEntry, bool, error) {
		return LedgerEntry{}, false, s.errf("append ledger %q and complete %q: %w", key, idemKey, err)
	}
	if s.cluster {
		v, err := s.rdb.Get(ctx, s.key("idem", idemKey)).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return fail(err)
		case v != idemPending+owner: // another's claim, or done (no caller of a done key's claim is left)
			return fail(ErrNotOwner)
		}
	}
	var (
		e     LedgerEntry // the entry the record is built for
		want  string      // its number; "" in the first round
		rec   []byte
		value []byte
		reply []string
	)
	for round := 0; round < maxLedgerRounds; round++ {
		if want != "" {
			value, err = result(e)
			if err != nil {
				return LedgerEntry{}, false, err
			}
			rec = append(append(rec[:0], idemDone...), value...)
		}
		err = s.replicated(ctx, keys[0], func(c redis.Cmdable) error {
			reply, err = appendLedgerCompleteScript.Run(ctx, c, keys, key, data, want, rec, ttlMillis(ttl), owner).StringSlice()
			return err
		})
		if err != nil {
			return fail(err)
		}
		switch {
		case len(reply) == 1 && reply[0] == "notowner":
			return fail(ErrNotOwner)
		case len(reply) == 3 && reply[0] == "ok":
			offers, err := strconv.Atoi(reply[2])
			if err != nil {
				return fail(fmt.Errorf("unexpected script reply %q", reply))
			}
			e.Offers = offers
			if s.cluster {
				// The entry is written; a crash before its record leaves it to the retry,
				// which finds the key's entry (a second offer, not a second write).
				if err := s.Complete(ctx, idemKey, owner, value, ttl); err != nil {
					return fail(fmt.Errorf("entry %s stored, its record not: %w", e.ID, err))
				}
			}
			return e, reply[1] == "1", nil
		case len(reply) == 3 && reply[0] == "moved" && reply[1] == "0":
			n, err := strconv.ParseInt(reply[2], 10, 64)
			if err != nil {
				return fail(fmt.Errorf("unexpected script reply %q", reply))
			}
			e, want = fresh, strconv.FormatInt(n+1, 10)
			e.ID = ledgerID(n + 1)
		case len(reply) == 3 && reply[0] == "moved":
			n, err := strconv.ParseInt(reply[1], 10, 64)
			if err != nil {
				return fail(fmt.Errorf("unexpected script reply %q", reply))
			}
			if e, err = decodeLedger(n, reply[2]); err != nil {
				return LedgerEntry{}, false, err
			}
			want = reply[1]
		default:
			return fail(fmt.Errorf("unexpected script reply %q", reply))
		}
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
	}
	return fail(fmt.Errorf("gave up after %d rounds lost to other writers", maxLedgerRounds))
}

// LedgerEntries reads the list and both hashes in one MULTI, so the offers match the entries.
func (s *Redis) LedgerEntries(ctx context.Context) ([]LedgerEntry, error) {
	k := s.ledgerKeys()
	var list *redis.StringSliceCmd
	var index, offers *redis.MapStringStringCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		list = p.LRange(ctx, k[0], 0, -1)
		index = p.HGetAll(ctx, k[1])
		offers = p.HGetAll(ctx, k[2])
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, s.errf("ledger entries: %w", err)
	}
	var out []LedgerEntry
	for i, r := range list.Val() {
		seq := int64(i + 1)
		e, err := decodeLedger(seq, r)
		if err != nil {
			return nil, err
		}
		// Only the key's indexed entry has its offers; an older duplicate (from before the
		// ledger upserted) counts as one.
		if index.Val()[e.Key] == strconv.FormatInt(seq, 10) {
			if n, err := strconv.Atoi(offers.Val()[e.Key]); err == nil {
				e.Offers = n
			}
		}
		out = append(out, e)
	}
	return out, nil
}
