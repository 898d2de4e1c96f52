package store

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrOldLayout is returned by OpenRedis for a prefix that still holds keys in the layout
// of releases before keys carried hash tags: MigrateRedis moves them.
var ErrOldLayout = errors.New("the store holds keys in the layout of an older release: stop the services and run `handoff store migrate --store URL`")

// oldKinds are the keys of the old layout that were <kind>:<id> (after the prefix); the
// new key of each is key(kind, id).
var oldKinds = []string{"run", "events", "wallet", "idem", "request", "requestsum", "jobsum", "lease"}

// newName is the new layout's key for an old one (the part after the prefix), or "" for a
// key that is not the old layout's (or is the old index or sequence, which MigrateRedis
// handles itself).
func (s *Redis) newName(old string) string {
	switch old {
	case "ledger":
		return s.ledgerKeys()[0]
	case "ledger:keys":
		return s.ledgerKeys()[1]
	case "ledger:offers":
		return s.ledgerKeys()[2]
	}
	if strings.HasPrefix(old, "{") {
		return ""
	}
	for _, k := range oldKinds {
		if id, ok := strings.CutPrefix(old, k+":"); ok {
			return s.key(k, id)
		}
	}
	return ""
}

// oldLayout reports whether the prefix holds the old layout's run sequence or ledger (one
// of them exists wherever a run was created or a write made).
func (s *Redis) oldLayout(ctx context.Context) (bool, error) {
	for _, k := range []string{"runs:seq", "ledger"} {
		n, err := s.rdb.Exists(ctx, s.prefix+k).Result()
		if err != nil {
			return false, s.errf("check key layout: %w", err)
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// MigrateRedis moves the keys an older release wrote under the store's prefix (<kind>:<id>,
// one global run index, sequence and ledger) to this release's layout (hash-tagged keys,
// the index spread over buckets), and reports how many keys it moved. It is for one Redis
// server (RENAME across slots is refused by a cluster): migrate there, then move the data
// to a cluster if wanted (redis-cli --cluster import). The services must be stopped while
// it runs. Each key is renamed with RENAMENX, keeping its value and expiry, so running it
// again, or after it stopped part way, moves only what is left; a key whose new name is
// taken is an error naming both, and nothing of it is lost. Runs keep their order: their old
// creation numbers become their scores, below every score this release gives.
func MigrateRedis(ctx context.Context, s *Redis) (int, error) {
	if s.cluster {
		return 0, errors.New("store: migrate on the single Redis the old release used, not on a cluster")
	}
	moved := 0
	var keys []string
	iter := s.rdb.Scan(ctx, 0, globQuote(s.prefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return 0, s.errf("migrate: scan: %w", err)
	}
	for _, k := range keys {
		old, ok := strings.CutPrefix(k, s.prefix)
		if !ok {
			continue
		}
		to := s.newName(old)
		if to == "" {
			continue
		}
		ok, err := s.rdb.RenameNX(ctx, k, to).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return moved, s.errf("migrate %s: %w", k, err)
		}
		if !ok {
			return moved, s.errf("migrate %s: %s exists already; compare the two and delete one", k, to)
		}
		moved++
	}
	// The index: each run into its bucket, scored by its creation number.
	index := s.prefix + "runs:index"
	for {
		zs, err := s.rdb.ZRangeWithScores(ctx, index, 0, 999).Result()
		if err != nil {
			return moved, s.errf("migrate %s: %w", index, err)
		}
		if len(zs) == 0 {
			break
		}
		pipe := s.rdb.TxPipeline()
		for _, z := range zs {
			pipe.ZAddNX(ctx, s.bucketKey(z.Member.(string)), z)
			pipe.ZRem(ctx, index, z.Member)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return moved, s.errf("migrate %s: %w", index, err)
		}
	}
	n, err := s.rdb.Del(ctx, s.prefix+"runs:seq").Result()
	if err != nil {
		return moved, s.errf("migrate: %w", err)
	}
	return moved + int(n), nil
}

// globQuote quotes the pattern characters of SCAN MATCH, so a prefix matches literally.
func globQuote(p string) string {
	var b strings.Builder
	for _, r := range p {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
