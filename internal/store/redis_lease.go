package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Leases on Redis live under {<name>}:lease (after the prefix): a string holding the owner,
// with the lease's ttl as its expiry (PX), so an expired lease is simply absent.
//
// Beside them, an index of expiries lets a replica find lapsed leases without scanning:
// {leases:<b>}:index, 16 sorted sets (bucket by an FNV hash of the name, as the run index),
// member the lease name, score its expiry in the server's milliseconds. Each acquire or
// renewal writes its expiry there after the lease itself, and a release removes it. The
// lease and its bucket are in different slots, so on a cluster they are two steps: the
// index is a hint (a holder that died between the two has an older expiry listed, which
// lapses sooner; AcquireLease decides), and the lease key alone decides who holds it.

// acquireLeaseScript takes a free lease (SET NX PX) or renews one the caller holds (compare,
// then PEXPIRE), in one step. Reply: the lease's new expiry (server time in ms) when the
// caller holds the lease afterwards, else 0. KEYS: lease. ARGV: owner, ttl in ms.
var acquireLeaseScript = redis.NewScript(`
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return exp end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return exp
end
return 0
`)

// acquireLeaseIndexedScript is acquireLeaseScript with the lease's index entry written in the
// same step, and, with ARGV[4] "1", the run's fence INCRed after the lease is held: for one
// Redis, where the bucket and the fence (other slots) are reachable from one script; a
// cluster takes the steps apart. KEYS: lease, index bucket, fence (with ARGV[4] "1"). ARGV:
// owner, ttl in ms, lease name, fence flag. Reply: {expiry, epoch}, as takeLease's.
var acquireLeaseIndexedScript = redis.NewScript(takeLeaseLua + `
local fence = nil
if ARGV[4] == '1' then fence = KEYS[3] end
local exp, epoch = takeLease(KEYS[1], KEYS[2], fence, ARGV[1], ARGV[2], ARGV[3])
return {exp, epoch}
`)

// takeLeaseLua defines takeLease(lease, bucket, fence, owner, ttl, name): the lease taken
// when free or renewed when owner holds it, its index entry written, and then, when fence
// is not nil, the run's fence INCRed. The index and the fence are written with pcall, after
// the lease: a failed index write is no error (as in AcquireLease), a failed fence is
// reported as epoch -1. Returns expiry (server time in ms) and epoch (0 without a fence);
// 0, 0 when the lease is another's, and then nothing is written.
const takeLeaseLua = `
local function takeLease(lease, bucket, fence, owner, ttl, name)
  local t = redis.call('TIME')
  local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl)
  if not redis.call('SET', lease, owner, 'NX', 'PX', ttl) then
    if redis.call('GET', lease) ~= owner then return 0, 0 end
    redis.call('PEXPIRE', lease, ttl)
  end
  redis.pcall('ZADD', bucket, string.format('%.0f', exp), name)
  local epoch = 0
  if fence then
    epoch = redis.pcall('INCR', fence)
    if type(epoch) ~= 'number' then epoch = -1 end
  end
  return exp, epoch
end
`

// leasedLua wraps body, the steps of a script that creates a run (replying {"created",
// timeline length} or a refusal), so that a run it creates is created holding its lease:
// takeLease on KEYS[1..3] (lease, index bucket, fence) with ARGV[1..3] (owner, ttl in ms,
// lease name), after the run's steps. Reply: body's, and on {"created", n} the epoch
// appended (0: another owner holds the lease; -1: the fence's INCR failed). A lease key
// holding something other than a lease is refused first, {"leasetype", its type}, with
// nothing written: found by takeLease, its error would come after the run was stored.
func leasedLua(body string) string {
	return takeLeaseLua + `
local lt = redis.call('TYPE', KEYS[1])['ok']
if lt ~= 'none' and lt ~= 'string' then return {'leasetype', lt} end
local function create()` + body + `end
local r = create()
if r[1] ~= 'created' then return r end
local _, epoch = takeLease(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
r[3] = tostring(epoch)
return r
`
}

// acquireIndexed is acquireLeaseIndexedScript: held, the run's new epoch when fence (-1
// when that INCR failed).
func (s *Redis) acquireIndexed(ctx context.Context, name, owner string, ttl time.Duration, fenceKey string) (bool, int64, error) {
	keys, flag := []string{s.key("lease", name), s.leaseBucket(name)}, "0"
	if fenceKey != "" {
		keys, flag = append(keys, fenceKey), "1"
	}
	res, err := acquireLeaseIndexedScript.Run(ctx, s.run, keys, owner, ttlMillis(ttl), name, flag).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("unexpected script reply %v", res)
	}
	return res[0] != 0, res[1], nil
}

// lapsedScript lists the members of one bucket of the lease index whose expiry is past, by
// the clock of the server holding the bucket. Redis keeps a key through the millisecond of
// its expiry (it is expired once now > when), so only a score below now has lapsed: listing
// one equal to now would offer a lease AcquireLease still finds held. KEYS: bucket. ARGV:
// limit.
var lapsedScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[1]))
`)

// leaseBucket is the bucket of the lease index that lists lease name.
func (s *Redis) leaseBucket(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return s.leaseIndex(int(h.Sum32() % runBuckets))
}

func (s *Redis) leaseIndex(b int) string { return s.key("index", "leases:"+strconv.Itoa(b)) }

// releaseLeaseScript deletes the lease only while the caller holds it (compare-and-delete).
// KEYS: lease. ARGV: owner. Reply 1 when it deleted, else 0.
var releaseLeaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// releaseLeaseIndexedScript is releaseLeaseScript that also unlists the lease it deleted, for
// one Redis (the bucket is in another slot). KEYS: lease, index bucket. ARGV: owner, lease
// name. Reply 1 when it deleted, else 0.
var releaseLeaseIndexedScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
`)

func (s *Redis) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if err := checkLease(name, owner, ttl, true); err != nil {
		return false, err
	}
	if !s.cluster { // the lease and its index entry in one script
		held, _, err := s.acquireIndexed(ctx, name, owner, ttl, "")
		if err != nil {
			return false, s.errf("acquire lease %s for %s: %w", name, owner, err)
		}
		return held, nil
	}
	exp, err := acquireLeaseScript.Run(ctx, s.run, []string{s.key("lease", name)}, owner, ttlMillis(ttl)).Int64()
	if err != nil {
		return false, s.errf("acquire lease %s for %s: %w", name, owner, err)
	}
	if exp == 0 {
		return false, nil
	}
	// The lease is held whatever the index says. A failed index write is no error of the
	// acquire: it only hides this lease's lapse from LapsedLeases until the holder's next
	// renewal writes it (the coordinator's slow scan still finds the run meanwhile), and
	// reporting it would make the caller give up a lease it holds.
	s.rdb.ZAdd(ctx, s.leaseBucket(name), redis.Z{Score: float64(exp), Member: name})
	return true, nil
}

// AcquireLeaseFence is, on one Redis, one script (acquireLeaseIndexedScript); on a cluster
// AcquireLease's script, then the lease's index entry and the run's fence (INCR) in one
// pipelined round trip. Either way the lease is held before either is written, as with
// AcquireLease then FenceRun, and the index entry stays a hint whose failure is no error.
func (s *Redis) AcquireLeaseFence(ctx context.Context, name, owner string, ttl time.Duration, runID string) (bool, uint64, error) {
	if err := checkLease(name, owner, ttl, true); err != nil {
		return false, 0, err
	}
	if runID == "" {
		return false, 0, fmt.Errorf("store: fence run: run_id is empty")
	}
	if !s.cluster {
		held, epoch, err := s.acquireIndexed(ctx, name, owner, ttl, s.key("fence", runID))
		switch {
		case err != nil:
			return false, 0, s.errf("acquire lease %s for %s: %w", name, owner, err)
		case held && epoch <= 0:
			return true, 0, s.errf("fence run %s: the INCR failed", runID)
		}
		return held, uint64(max(epoch, 0)), nil
	}
	exp, err := acquireLeaseScript.Run(ctx, s.run, []string{s.key("lease", name)}, owner, ttlMillis(ttl)).Int64()
	if err != nil {
		return false, 0, s.errf("acquire lease %s for %s: %w", name, owner, err)
	}
	if exp == 0 {
		return false, 0, nil
	}
	pipe := s.rdb.Pipeline()
	pipe.ZAdd(ctx, s.leaseBucket(name), redis.Z{Score: float64(exp), Member: name})
	fence := pipe.Incr(ctx, s.key("fence", runID))
	pipe.Exec(ctx) // each command's own error is read below: the index's is ignored, as in AcquireLease
	epoch, err := fence.Uint64()
	if err != nil {
		return true, 0, s.errf("fence run %s: %w", runID, err)
	}
	return true, epoch, nil
}

func (s *Redis) ReleaseLease(ctx context.Context, name, owner string) error {
	if err := checkLease(name, owner, 0, false); err != nil {
		return err
	}
	if !s.cluster {
		if err := releaseLeaseIndexedScript.Run(ctx, s.run, []string{s.key("lease", name), s.leaseBucket(name)}, owner, name).Err(); err != nil {
			return s.errf("release lease %s for %s: %w", name, owner, err)
		}
		return nil
	}
	n, err := releaseLeaseScript.Run(ctx, s.run, []string{s.key("lease", name)}, owner).Int64()
	if err != nil {
		return s.errf("release lease %s for %s: %w", name, owner, err)
	}
	if n == 1 { // only the holder's release unlists it: another holder's entry stays
		if err := s.rdb.ZRem(ctx, s.leaseBucket(name), name).Err(); err != nil {
			return s.errf("release lease %s for %s: unindex it: %w", name, owner, err)
		}
	}
	return nil
}

// LapsedLeases reads the 16 buckets of the lease index in one pipelined round trip (one per
// shard on a cluster): a few hundred bytes when nothing lapsed, whatever the number of
// leases held.
func (s *Redis) LapsedLeases(ctx context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 100
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, runBuckets)
	for b := range runBuckets {
		cmds[b] = lapsedScript.Eval(ctx, pipe, []string{s.leaseIndex(b)}, limit)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, s.errf("lapsed leases: %w", err)
	}
	var out []string
	for _, c := range cmds {
		names, err := c.StringSlice()
		if err != nil {
			return nil, s.errf("lapsed leases: %w", err)
		}
		out = append(out, names...)
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Fences on Redis: {<run_id>}:fence, a counter in the run's slot (so a save checks it in its
// own script), never expiring. FenceRun is INCR; PutRunFenced is putRunEventsScript's write
// behind a compare of the counter with the save's epoch.

// putRunFencedScript replaces a run that exists and appends events, only while the run's
// fence is the save's epoch. KEYS: run, events, fence. ARGV: epoch, Job bytes, event
// bytes... Reply: the timeline's length after the events, -2 for no such run, -1 (nothing
// written) for a fence other than the epoch.
var putRunFencedScript = redis.NewScript(pushLua + `
if (redis.call('GET', KEYS[3]) or '0') ~= ARGV[1] then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
redis.call('SET', KEYS[1], ARGV[2])
return push(KEYS[2], 3) or redis.call('LLEN', KEYS[2])
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

// fenceAtScript raises the fence to ARGV[1] unless it is past it. KEYS: fence. ARGV: epoch.
// Reply 1 when the fence is the epoch afterwards, -1 (nothing written) when it was past it.
// The fence is a decimal string either way, so FenceRun's INCR goes on from it.
var fenceAtScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local e = tonumber(ARGV[1])
if cur > e then return -1 end
if cur < e then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
`)

func (s *Redis) FenceRunAt(ctx context.Context, runID string, epoch uint64) error {
	if err := checkFenceAt(runID, epoch); err != nil {
		return err
	}
	n, err := fenceAtScript.Run(ctx, s.run, []string{s.key("fence", runID)}, strconv.FormatUint(epoch, 10)).Int64()
	switch {
	case err != nil:
		return s.errf("fence run %s at epoch %d: %w", runID, epoch, err)
	case n < 0:
		return s.errf("fence run %s at epoch %d: %w", runID, epoch, ErrFenced)
	}
	return nil
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
	last, err := putRunFencedScript.Run(ctx, s.run, []string{s.key("run", id), s.key("events", id), s.key("fence", id)}, args...).Int64()
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
