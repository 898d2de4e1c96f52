package store

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Leases on Redis live under lease:<name> (after the prefix): a string holding the owner,
// with the lease's ttl as its expiry (PX), so an expired lease is simply absent.

// acquireLeaseScript takes a free lease (SET NX PX) or renews one the caller holds (compare,
// then PEXPIRE), in one step. Reply 1 when the caller holds the lease afterwards, else 0.
// KEYS: lease. ARGV: owner, ttl in ms.
var acquireLeaseScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

// releaseLeaseScript deletes the lease only while the caller holds it (compare-and-delete).
// KEYS: lease. ARGV: owner. Reply 1 when it deleted, else 0.
var releaseLeaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

func (s *Redis) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if err := checkLease(name, owner, ttl, true); err != nil {
		return false, err
	}
	n, err := acquireLeaseScript.Run(ctx, s.rdb, []string{s.key("lease", name)}, owner, ttlMillis(ttl)).Int64()
	if err != nil {
		return false, s.errf("acquire lease %s for %s: %w", name, owner, err)
	}
	return n == 1, nil
}

func (s *Redis) ReleaseLease(ctx context.Context, name, owner string) error {
	if err := checkLease(name, owner, 0, false); err != nil {
		return err
	}
	if err := releaseLeaseScript.Run(ctx, s.rdb, []string{s.key("lease", name)}, owner).Err(); err != nil {
		return s.errf("release lease %s for %s: %w", name, owner, err)
	}
	return nil
}
