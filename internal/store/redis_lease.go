package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
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

// Fences on Redis: {<run_id>}:fence, a counter in the run's slot (so a save checks it in its
// own script), never expiring. FenceRun is INCR; PutRunFenced is putRunEventsScript's write
// behind a compare of the counter with the save's epoch.

// putRunFencedScript replaces a run that exists and appends events, only while the run's
// fence is the save's epoch. KEYS: run, events, fence. ARGV: epoch, Job bytes, event
// bytes... Reply: the timeline's length after the events, -2 for no such run, -1 (nothing
// written) for a fence other than the epoch.
var putRunFencedScript = redis.NewScript(`
if (redis.call('GET', KEYS[3]) or '0') ~= ARGV[1] then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
redis.call('SET', KEYS[1], ARGV[2])
local n = redis.call('LLEN', KEYS[2])
for i = 3, #ARGV do n = redis.call('RPUSH', KEYS[2], ARGV[i]) end
return n
`)

func (s *Redis) FenceRun(ctx context.Context, runID string) (uint64, error) {
	if runID == "" {
		return 0, fmt.Errorf("store: fence run: run_id is empty")
	}
	n, err := s.rdb.Incr(ctx, s.key("fence", runID)).Uint64()
	if err != nil {
		return 0, s.errf("fence run %s: %w", runID, err)
	}
	return n, nil
}

func (s *Redis) PutRunFenced(ctx context.Context, job *handoffv1.Job, epoch uint64, evs ...*handoffv1.JobEvent) error {
	data, err := proto.Marshal(job)
	if err != nil {
		return fmt.Errorf("store: encode run %s: %w", job.GetRunId(), err)
	}
	args, err := appendEncoded([]any{strconv.FormatUint(epoch, 10), data}, job.GetRunId(), evs)
	if err != nil {
		return err
	}
	id := job.GetRunId()
	last, err := putRunFencedScript.Run(ctx, s.rdb, []string{s.key("run", id), s.key("events", id), s.key("fence", id)}, args...).Int64()
	switch {
	case err != nil:
		return s.errf("put run %s: %w", id, err)
	case last == -2:
		return s.errf("put run %s: %w", id, ErrNotFound)
	case last < 0:
		return s.errf("put run %s under epoch %d: %w", id, epoch, ErrFenced)
	}
	if len(evs) > 0 {
		numberEvents(evs, uint64(last))
	}
	return nil
}
