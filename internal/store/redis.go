package store

// Redis is the Store for more than one process: coordinators and runners on several hosts
// share one Redis, so a Claim or a Debit made by one is seen by all of them.
//
// Key layout. Every key starts with RedisOptions.Prefix ("handoff:" by default; left out
// below), so several deployments or test runs can share one Redis, and one can be deleted by
// prefix without touching the others. After it comes a hash tag in braces, the id the
// record belongs to, and the kind of record: {<id>}:<kind>. Redis Cluster places a key by
// its hash tag, so the records of one run (run, events, its wallet, whose id is the run id)
// share a slot, and runs spread over all slots:
//
//	{<run_id>}:run          string  proto.Marshal(Job): the run as of its last PutRun.
//	{<run_id>}:events       list    proto.Marshal(JobEvent) with seq cleared; the element at
//	                                index i is the event with seq i+1 (append-only, so the
//	                                position is the sequence number and needs no counter).
//	{runs:<b>}:index        zset    bucket b (0-15, by an FNV hash of the run id) of the run
//	                                index: member run_id, score the server's time in
//	                                microseconds when it was created (raised past the
//	                                bucket's newest, so unique in a bucket). ListRuns merges
//	                                the buckets newest first; the page token is
//	                                "score:run_id" of the page's last run.
//	{<request_id>}:request  string  run_id created for that request id (CreateRun dedupe).
//	{<request_id>}:requestsum  string  RequestDigest of that request: a request id used
//	                                again for a different request is refused.
//	{<job_id>}:jobsum       string  JobDigest of the first run created with that job id: a
//	                                job id submitted again with other content is refused.
//	{<key>}:idem            string  idempotency record: "P"+owner (pending claim, owner its
//	                                token; a bare "P" is a claim of a release before claims
//	                                had owners) or "D"+value (done, value is the first
//	                                result). Complete, Release and RenewClaim compare the
//	                                owner in the script that writes. Lifetime: a pending
//	                                marker is SET NX PX pendingTTL (no expiry if <= 0), so
//	                                a claimer that died frees the key when it lapses;
//	                                Complete replaces it with the done record, expiring
//	                                after ttl (PX) or never (ttl <= 0: SET drops the
//	                                marker's expiry); Release deletes it only while it is
//	                                still pending. Redis expiry replaces bbolt's stored
//	                                deadline: an expired record is simply absent.
//	{<id>}:wallet           hash    fields usd, revisions, hops: decimal integers, so the
//	                                Debit script does exact integer arithmetic on them; job:
//	                                the job_id the wallet belongs to (absent in wallets
//	                                opened before wallets recorded it); a field
//	                                paid:<idempotency key> for each hop Admit debited;
//	                                and the run's verdicts (RecordVerdict, verdicts.go):
//	                                vfailed "1" once a FAIL was recorded, vlast the last
//	                                verdict's number, which Admit checks (ErrSilentReset).
//	{<name>}:lease          string  a lease's owner, expiring with the lease (redis_lease.go).
//	{leases:<b>}:index      zset    bucket b (0-15, FNV of the name) of the lease index:
//	                                member a lease name, score its expiry (server ms), so
//	                                LapsedLeases finds the leases of a dead holder in one
//	                                pipelined read; a release removes the member.
//	{<run_id>}:fence        string  the run's fence epoch (INCR by FenceRun; a nested run's raised to its
//	                                parent driver's epoch by FenceRunAt), checked by
//	                                PutRunFenced in the script that saves the run.
//	{ledger}:entries        list    JSON {Key, Payload, At}; the element at index i is entry
//	                                ledger-%06d of i+1 (append-only, like events).
//	{ledger}:keys           hash    ledger key -> its entry's number: the ledger upserts by key.
//	{ledger}:offers         hash    ledger key -> how many appends named it (LedgerEntry.Offers).
//
// Releases before this layout wrote <kind>:<id> keys, one global run index and sequence
// and an untagged ledger; OpenURL refuses such a prefix (ErrOldLayout) and MigrateRedis
// (`handoff store migrate`) moves it.
//
// Atomicity. Each operation that reads and then writes, or touches several keys, is one Lua
// script (EVALSHA, falling back to EVAL when the server has not cached it), which Redis runs
// with nothing interleaved, so concurrent callers in different processes cannot race. Every
// script's keys are in one slot, so each runs on Redis Cluster too. Where one command is
// already atomic it is used alone: PutRun without events is SET XX, Complete is SET.
// AppendLedger is a script (an upsert: look the key up, else RPUSH, whose reply is the new
// length, i.e. the sequence number), and AppendLedgerComplete one that also stores the
// idempotency record (redis_ledger.go). The agent runner's hop is Admit (claim + wallet
// debit, one script) and Complete.
//
// What spans slots is several scripts, each safe to repeat, in an order a crash between
// them leaves safe to retry: CreateRun (request, job digest, index, run: redis_runs.go)
// always; on a cluster also Admit (claim, then the debit, which the wallet's paid mark keeps
// to once per key) and AppendLedgerComplete (the upsert, then the record: a retry finds the
// key's entry rather than writing another).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

var _ Store = (*Redis)(nil)

// RedisOptions configures OpenRedis. The zero value talks to 127.0.0.1:6379.
type RedisOptions struct {
	// Addr is host:port of the server; default 127.0.0.1:6379. Ignored when Client is set.
	Addr string
	// Cluster, when non-empty, is host:port of some nodes of a Redis Cluster (the client
	// learns the others from them), used instead of Addr; DB must then be 0.
	Cluster []string
	// Password and DB select the server's auth and logical database. Ignored with Client.
	Password string
	DB       int
	// Prefix starts every key this store writes; default "handoff:" (empty means default).
	Prefix string
	// Timeouts are short by default (2s dial, 3s read and write) so an unreachable Redis
	// fails a health check or a hop quickly instead of hanging it. Ignored with Client.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// Client, when set, is used instead of dialling a new one, so several stores (or other
	// users) can share one connection pool. Close leaves it open: its owner closes it.
	// It should have retries disabled (MaxRetries -1), for the reason given in OpenRedis.
	Client redis.UniversalClient
	// WaitReplicas, when positive, makes every idempotency claim, receipt and ledger write
	// WAIT until that many replicas acknowledged it (at most WaitTimeout, default 2s)
	// before the call returns; a write not replicated in time is an error
	// (ErrNotReplicated). Redis replicates asynchronously, so without it a write the
	// caller was told of can vanish with its master in a failover: a claim (and the
	// external write it guards is made again), or a ledger entry. URL: ?wait=N.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// ErrNotReplicated: a write WaitReplicas asked to be replicated was not acknowledged by
// enough replicas within WaitTimeout. It was made on the master and may still be lost.
var ErrNotReplicated = errors.New("the write was not acknowledged by enough replicas in time")

// Redis is the Store on a Redis server (see the key layout above). It is safe for concurrent
// use, and any number of processes may share one server and prefix.
type Redis struct {
	rdb   redis.UniversalClient
	owned bool // Close closes rdb only when OpenRedis dialled it
	// run sends the scripts: rdb, or on one server rdb behind a scriptBatcher
	// (redis_batch.go), which lets concurrent script calls share pipelines.
	run redis.Cmdable
	// cluster: keys of different slots may be on different servers (a cluster, or a Ring
	// of shards: any client but a *redis.Client), so the operations that would touch
	// several slots in one script run one script per slot (Admit, AppendLedgerComplete,
	// CreateRun, leases and their index and fence); on one server they keep their single
	// script.
	cluster bool
	addr    string // for error messages
	prefix  string
	now     func() time.Time
	// waitReplicas and waitTimeout: RedisOptions.WaitReplicas and WaitTimeout.
	waitReplicas int
	waitTimeout  time.Duration
}

// replicated runs f on the connection of the master that holds key and, with WaitReplicas,
// WAITs on that same connection (WAIT counts the writes of its own connection) for the
// replicas to acknowledge what f wrote. Without WaitReplicas it is f on the client the
// scripts go through (s.run).
func (s *Redis) replicated(ctx context.Context, key string, f func(c redis.Cmdable) error) error {
	if s.waitReplicas <= 0 {
		return f(s.run)
	}
	var conn *redis.Conn
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		conn = m.Conn()
	case *redis.Client:
		conn = c.Conn()
	default:
		return fmt.Errorf("wait for replicas: unsupported client %T", s.rdb)
	}
	defer conn.Close()
	if err := f(conn); err != nil {
		return err
	}
	n, err := conn.Wait(ctx, s.waitReplicas, s.waitTimeout).Result()
	if err != nil {
		return fmt.Errorf("wait for %d replica(s): %w", s.waitReplicas, err)
	}
	if n < int64(s.waitReplicas) {
		return fmt.Errorf("%w: %d of %d replicas within %s", ErrNotReplicated, n, s.waitReplicas, s.waitTimeout)
	}
	return nil
}

// OpenRedis connects to Redis and checks that it answers a PING, so a wrong address fails at
// start-up, naming the address, rather than on the first hop.
//
// The client it dials has retries off: go-redis retries a command after a connection error,
// which may come after the server has run it, and a retried Debit or AppendLedger would then
// be applied twice, and a retried Claim would report Pending to the caller that owns the key.
// A failed call is returned instead; callers already retry hops at their own level.
func OpenRedis(ctx context.Context, o RedisOptions) (*Redis, error) {
	if o.Prefix == "" {
		o.Prefix = "handoff:"
	}
	s := &Redis{prefix: o.Prefix, now: time.Now, waitReplicas: o.WaitReplicas, waitTimeout: orDefault(o.WaitTimeout, 2*time.Second)}
	dialTimeout := orDefault(o.DialTimeout, 2*time.Second)
	switch {
	case o.Client != nil:
		s.rdb, s.addr = o.Client, clientAddr(o.Client)
	case len(o.Cluster) > 0:
		if o.DB != 0 {
			return nil, fmt.Errorf("redis cluster %s: database %d: a cluster has only database 0", strings.Join(o.Cluster, ","), o.DB)
		}
		s.rdb = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 o.Cluster,
			Password:              o.Password,
			DialTimeout:           dialTimeout,
			Dialer:                dialRedis(dialTimeout), // redis_conn.go
			ReadTimeout:           orDefault(o.ReadTimeout, 3*time.Second),
			WriteTimeout:          orDefault(o.WriteTimeout, 3*time.Second),
			ContextTimeoutEnabled: true,
			// Retries off, as for one server. Redirects (MOVED, ASK) are still followed:
			// a node that redirects has not run the command.
			MaxRetries: -1,
			// The slot map is reloaded on MOVED, and otherwise once it is older than this
			// (go-redis's default is 60s). A master that died answers nothing, not MOVED,
			// so after a failover only the map's age brings its promoted replica in: a
			// short interval keeps the store's outage to the failover itself. A reload is
			// one CLUSTER SLOTS, made only when a command comes.
			ClusterStateReloadInterval: time.Second,
		})
		s.addr, s.owned = strings.Join(o.Cluster, ","), true
	default:
		if o.Addr == "" {
			o.Addr = "127.0.0.1:6379"
		}
		s.rdb = redis.NewClient(&redis.Options{
			Addr:                  o.Addr,
			Password:              o.Password,
			DB:                    o.DB,
			DialTimeout:           dialTimeout,
			Dialer:                dialRedis(dialTimeout), // redis_conn.go
			ReadTimeout:           orDefault(o.ReadTimeout, 3*time.Second),
			WriteTimeout:          orDefault(o.WriteTimeout, 3*time.Second),
			ContextTimeoutEnabled: true, // a caller's deadline bounds each command too
			MaxRetries:            -1,   // see above: never run a write twice
		})
		s.addr, s.owned = o.Addr, true
	}
	// Only a client of one server (or of one master, a failover client) may run a script
	// on keys of several hash tags: a cluster, and a Ring of shards, route each script by
	// its first key, so every other client gets the per-slot steps.
	one, single := s.rdb.(*redis.Client)
	s.cluster = !single
	s.run = s.rdb
	if single && one.Options().MaxRetries == 0 { // -1 in Options: retries off
		// Batched only without retries: go-redis retries a failed pipeline whole, which
		// would run again the calls of it that had run.
		s.run = newScriptBatcher(one)
	}
	if err := s.Ping(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// clientAddr names a shared client's server(s) for error messages.
func clientAddr(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		return strings.Join(slices.Sorted(maps.Values(c.Options().Addrs)), ",")
	}
	return "(shared client)"
}

// errf formats an error that says which server failed and what was being done.
func (s *Redis) errf(format string, args ...any) error {
	return fmt.Errorf("redis %s: "+format, append([]any{s.addr}, args...)...)
}

// key is the key of one kind of record of one id: prefix + "{" + id + "}:" + kind. The id
// in braces is the key's hash tag, so on Redis Cluster every record of one id (a run's run,
// events and wallet) is in one slot and different ids spread over all of them.
func (s *Redis) key(kind, id string) string { return s.prefix + "{" + id + "}:" + kind }

// Ping sends a PING (health checks).
func (s *Redis) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return s.errf("ping: %w", err)
	}
	return nil
}

// Close closes the client if OpenRedis dialled it; a shared Client is left to its owner.
func (s *Redis) Close() error {
	if !s.owned {
		return nil
	}
	if err := s.rdb.Close(); err != nil {
		return s.errf("close: %w", err)
	}
	return nil
}

// ---- Runs ----

func (s *Redis) GetRun(ctx context.Context, runID string) (*handoffv1.Job, error) {
	data, err := s.rdb.Get(ctx, s.key("run", runID)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, s.errf("get run %s: %w", runID, ErrNotFound)
	}
	if err != nil {
		return nil, s.errf("get run %s: %w", runID, err)
	}
	return decodeJob(data)
}

// putRunEventsScript replaces a run that exists and appends events to its timeline, in one
// step. KEYS: run, events. ARGV: Job bytes, event bytes... Reply: the timeline's length
// after the events (the last one's seq), or 0 for no such run.
var putRunEventsScript = redis.NewScript(pushLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return push(KEYS[2], 2) or 0
`)

// PutRun is SET XX (one command that writes only when the run exists), or, with events, a
// script that also appends them.
func (s *Redis) PutRun(ctx context.Context, job *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	data, err := proto.Marshal(job)
	if err != nil {
		return fmt.Errorf("store: encode run %s: %w", job.GetRunId(), err)
	}
	var ok bool
	if len(evs) == 0 {
		ok, err = s.rdb.SetXX(ctx, s.key("run", job.GetRunId()), data, 0).Result()
	} else {
		var args []any
		if args, err = appendEncoded([]any{data}, job.GetRunId(), evs); err != nil {
			return err
		}
		var last int64
		last, err = putRunEventsScript.Run(ctx, s.run, []string{s.key("run", job.GetRunId()), s.key("events", job.GetRunId())}, args...).Int64()
		ok = last > 0
		if ok && err == nil {
			numberEvents(evs, uint64(last))
		}
	}
	if err != nil {
		return s.errf("put run %s: %w", job.GetRunId(), err)
	}
	if !ok {
		return s.errf("put run %s: %w", job.GetRunId(), ErrNotFound)
	}
	return nil
}

// pushLua defines push(key, first): ARGV[first] onwards appended to list key, returning
// its new length (nil when there is nothing to append). A save's events go in one RPUSH
// rather than one each; past 1,000 values in several, as unpack puts its results on a Lua
// 5.1 stack of at most 8,000 slots.
const pushLua = `
local function push(key, first)
  local n
  for i = first, #ARGV, 1000 do n = redis.call('RPUSH', key, unpack(ARGV, i, math.min(i + 999, #ARGV))) end
  return n
end
`

// appendEncoded appends evs, encoded as the events list stores them, to a script's args.
func appendEncoded(args []any, runID string, evs []*handoffv1.JobEvent) ([]any, error) {
	for _, ev := range evs {
		b, err := encodeEvent(ev)
		if err != nil {
			return nil, fmt.Errorf("store: encode event for run %s: %w", runID, err)
		}
		args = append(args, b)
	}
	return args, nil
}

// appendEventScript appends an event to a run's timeline if the run exists, returning its
// seq (the list's new length), or 0 when there is no such run. KEYS: run, events. ARGV: bytes.
var appendEventScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('RPUSH', KEYS[2], ARGV[1])
`)

func (s *Redis) AppendEvent(ctx context.Context, runID string, ev *handoffv1.JobEvent) (uint64, error) {
	data, err := encodeEvent(ev)
	if err != nil {
		return 0, fmt.Errorf("store: encode event for run %s: %w", runID, err)
	}
	seq, err := appendEventScript.Run(ctx, s.run, []string{s.key("run", runID), s.key("events", runID)}, data).Int64()
	if err != nil {
		return 0, s.errf("append event to run %s: %w", runID, err)
	}
	if seq == 0 {
		return 0, s.errf("append event to run %s: %w", runID, ErrNotFound)
	}
	ev.Seq = uint64(seq)
	return uint64(seq), nil
}

func (s *Redis) Events(ctx context.Context, runID string, afterSeq uint64) ([]*handoffv1.JobEvent, error) {
	var raw []string
	if afterSeq < math.MaxInt64 {
		var err error
		raw, err = s.rdb.LRange(ctx, s.key("events", runID), int64(afterSeq), -1).Result()
		if err != nil {
			return nil, s.errf("events of run %s: %w", runID, err)
		}
	}
	if len(raw) == 0 {
		// No events after afterSeq: tell a missing run apart (runs are never deleted, so
		// this second read cannot contradict the first).
		n, err := s.rdb.Exists(ctx, s.key("run", runID)).Result()
		if err != nil {
			return nil, s.errf("events of run %s: %w", runID, err)
		}
		if n == 0 {
			return nil, s.errf("events of run %s: %w", runID, ErrNotFound)
		}
		return nil, nil
	}
	out := make([]*handoffv1.JobEvent, len(raw))
	for i, r := range raw {
		ev := &handoffv1.JobEvent{}
		if err := proto.Unmarshal([]byte(r), ev); err != nil {
			return nil, fmt.Errorf("store: decode event %d of run %s: %w", afterSeq+1+uint64(i), runID, err)
		}
		ev.Seq = afterSeq + 1 + uint64(i)
		out[i] = ev
	}
	return out, nil
}

// ---- Wallets ----

// openWalletScript creates the wallet of a job unless it exists, gives an existing one the
// job when it records none, and returns what it holds; {"wrongjob"} (nothing written) when
// it records another job.
// KEYS: wallet. ARGV: usd, revisions, hops, job. Reply: {"ok", usd, revisions, hops}.
var openWalletScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  local owner = redis.call('HGET', KEYS[1], 'job')
  if not owner then
    redis.call('HSET', KEYS[1], 'job', ARGV[4])
  elseif owner ~= ARGV[4] then
    return {'wrongjob'}
  end
  local w = redis.call('HMGET', KEYS[1], 'usd', 'revisions', 'hops')
  return {'ok', w[1], w[2], w[3]}
end
redis.call('HSET', KEYS[1], 'usd', ARGV[1], 'revisions', ARGV[2], 'hops', ARGV[3], 'job', ARGV[4])
return {'ok', ARGV[1], ARGV[2], ARGV[3]}
`)

// debitScript is ApplyDebit in Lua, on the wallet hash: hops and revisions are taken whole or
// the reply is {"empty"}; money is clamped at zero; RequireMoney refuses when none is left; a
// refusal ({"empty"}, {"negative"}, {"notfound"}) writes nothing. Reply on success: {"ok",
// usd, revisions, hops} as strings.
//
// Money is compared as decimal strings and changed with HINCRBY, never through a Lua number:
// those are doubles, exact only to 2^53, while the wallet holds any int64.
// With a job (Debit.Job) the wallet must record it, checked first: {"notfound"} or
// {"wrongjob"} otherwise.
// KEYS: wallet. ARGV: hops, revisions, usd (all >= 0 decimal except usd may be negative),
// requireMoney ("1" or "0"), job ("" for none).
var debitScript = redis.NewScript(debitLua + `
local refused = jobRefused(KEYS[1], ARGV[5])
if refused then return {refused} end
return debit(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
`)

// debitLua defines debit(wallet key, hops, revisions, usd, requireMoney), shared by
// debitScript and admitScript. On {"empty"} it also returns what the wallet holds, so a
// refusal can name the empty part without a second read. jobRefused(wallet key, job) is
// the job check before it (Debit.Job): nil when job is "" or the wallet records it, else
// 'notfound' (no wallet) or 'wrongjob' (another job's, or one that records none).
// debitFrom and refusal are the same rules on fields the caller has read already (pay
// reads all it needs in one HMGET); the reply's counts are the read ones less the debit
// (hops and revisions are uint32, exact as Lua numbers), and money, changed by HINCRBY, is
// read back as a string.
const debitLua = `
local function refusal(owner, exists, job)
  if job == '' or owner == job then return nil end
  if not exists then return 'notfound' end
  return 'wrongjob'
end
local function jobRefused(wkey, job)
  if job == '' then return nil end
  local owner = redis.call('HGET', wkey, 'job')
  if owner == job then return nil end
  return refusal(owner, redis.call('EXISTS', wkey) == 1, job)
end
local function cmp(a, b)
  local na, nb = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
  if na ~= nb then if na then return -1 else return 1 end end
  local sign = 1
  if na then a, b, sign = a:sub(2), b:sub(2), -1 end
  if #a ~= #b then if #a < #b then return -sign else return sign end end
  if a == b then return 0 end
  if a < b then return -sign else return sign end
end
local function debitFrom(wkey, usdHeld, revsHeld, hopsHeld, hops, revs, usd, requireMoney)
  if not usdHeld then return {'notfound'} end
  local dhops, drevs, dusd = tonumber(hops), tonumber(revs), usd
  local hopsLeft, revsLeft = tonumber(hopsHeld) - dhops, tonumber(revsHeld) - drevs
  if hopsLeft < 0 or revsLeft < 0 or (requireMoney == '1' and cmp(usdHeld, '0') <= 0) then
    return {'empty', usdHeld, revsHeld, hopsHeld}
  end
  if dusd:sub(1, 1) == '-' then return {'negative'} end
  local usdLeft = usdHeld
  if cmp(usdHeld, dusd) <= 0 then
    redis.call('HSET', wkey, 'usd', '0')
    usdLeft = '0'
  elseif dusd ~= '0' then
    redis.call('HINCRBY', wkey, 'usd', '-' .. dusd)
    usdLeft = redis.call('HGET', wkey, 'usd')
  end
  if drevs > 0 then redis.call('HINCRBY', wkey, 'revisions', -drevs) end
  if dhops > 0 then redis.call('HINCRBY', wkey, 'hops', -dhops) end
  return {'ok', usdLeft, string.format('%d', revsLeft), string.format('%d', hopsLeft)}
end
local function debit(wkey, hops, revs, usd, requireMoney)
  local w = redis.call('HMGET', wkey, 'usd', 'revisions', 'hops')
  return debitFrom(wkey, w[1], w[2], w[3], hops, revs, usd, requireMoney)
end
`

// parseBudget reads {usd, revisions, hops} decimal strings.
func parseBudget(f []string) (*handoffv1.Budget, error) {
	if len(f) != 3 {
		return nil, fmt.Errorf("wallet has %d fields, want 3", len(f))
	}
	usd, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("wallet usd: %w", err)
	}
	revs, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("wallet revisions: %w", err)
	}
	hops, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("wallet hops: %w", err)
	}
	return &handoffv1.Budget{UsdRemainingMicros: usd, RevisionsRemaining: uint32(revs), HopsRemaining: uint32(hops)}, nil
}

func (s *Redis) OpenWallet(ctx context.Context, id, job string, b *handoffv1.Budget) (*handoffv1.Budget, error) {
	if id == "" {
		return nil, fmt.Errorf("store: empty wallet id")
	}
	if job == "" {
		return nil, fmt.Errorf("store: open wallet %s: empty job id", id)
	}
	res, err := openWalletScript.Run(ctx, s.run, []string{s.key("wallet", id)},
		b.GetUsdRemainingMicros(), b.GetRevisionsRemaining(), b.GetHopsRemaining(), job).StringSlice()
	if err != nil {
		return nil, s.errf("open wallet %s: %w", id, err)
	}
	if len(res) == 1 && res[0] == "wrongjob" {
		return nil, s.errf("open wallet %s: %w", id, ErrWrongJob)
	}
	if len(res) != 4 || res[0] != "ok" {
		return nil, s.errf("open wallet %s: unexpected script reply %q", id, res)
	}
	out, err := parseBudget(res[1:])
	if err != nil {
		return nil, s.errf("open wallet %s: %w", id, err)
	}
	return out, nil
}

func (s *Redis) Debit(ctx context.Context, id string, d Debit) (*handoffv1.Budget, error) {
	require := "0"
	if d.RequireMoney {
		require = "1"
	}
	res, err := debitScript.Run(ctx, s.run, []string{s.key("wallet", id)},
		d.Hops, d.Revisions, d.USDMicros, require, d.Job).StringSlice()
	if err != nil {
		return nil, s.errf("debit wallet %s: %w", id, err)
	}
	switch res[0] {
	case "ok":
		out, err := parseBudget(res[1:])
		if err != nil {
			return nil, s.errf("debit wallet %s: %w", id, err)
		}
		return out, nil
	case "notfound":
		return nil, s.errf("debit wallet %s: %w", id, ErrNotFound)
	case "wrongjob":
		return nil, s.errf("debit wallet %s: %w", id, ErrWrongJob)
	case "empty":
		return nil, s.errf("debit wallet %s: %w", id, ErrWalletEmpty)
	case "negative":
		return nil, errors.New("store: a debit cannot add money")
	}
	return nil, s.errf("debit wallet %s: unexpected script reply %q", id, res)
}

// grantScript adds a grant once per key, recorded as the wallet's field "grant:<key>".
// Limits are checked in Lua numbers only for hops and revisions (small); money is added
// with HINCRBY, exact in int64, after a string comparison against the room left.
var grantScript = redis.NewScript(debitLua + `
local w = redis.call('HMGET', KEYS[1], 'usd', 'revisions', 'hops')
if not w[1] then return {'notfound'} end
local gk = 'grant:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], gk) == 1 then return {'ok', w[1], w[2], w[3]} end
if tonumber(w[3]) + tonumber(ARGV[2]) > 1000 or tonumber(w[2]) + tonumber(ARGV[3]) > 100 then return {'toolarge'} end
if cmp(w[1], ARGV[5]) > 0 then return {'toolarge'} end
redis.call('HINCRBY', KEYS[1], 'hops', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'revisions', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'usd', ARGV[4])
redis.call('HSET', KEYS[1], gk, '1')
w = redis.call('HMGET', KEYS[1], 'usd', 'revisions', 'hops')
return {'ok', w[1], w[2], w[3]}
`)

func (s *Redis) GrantWallet(ctx context.Context, id, key string, g Grant) (*handoffv1.Budget, error) {
	if key == "" {
		return nil, fmt.Errorf("store: grant to wallet %s: empty key", id)
	}
	if g.USDMicros < 0 {
		return nil, errors.New("store: a grant cannot take money")
	}
	// room is the most money the wallet may hold before this grant without overflowing.
	room := strconv.FormatInt(math.MaxInt64-g.USDMicros, 10)
	res, err := grantScript.Run(ctx, s.run, []string{s.key("wallet", id)}, key, g.Hops, g.Revisions, g.USDMicros, room).StringSlice()
	if err != nil {
		return nil, s.errf("grant to wallet %s: %w", id, err)
	}
	switch res[0] {
	case "ok":
		out, err := parseBudget(res[1:])
		if err != nil {
			return nil, s.errf("grant to wallet %s: %w", id, err)
		}
		return out, nil
	case "notfound":
		return nil, s.errf("grant to wallet %s: %w", id, ErrNotFound)
	case "toolarge":
		return nil, s.errf("grant to wallet %s: %w", id, ErrGrantTooLarge)
	}
	return nil, s.errf("grant to wallet %s: unexpected script reply %q", id, res)
}

func (s *Redis) Wallet(ctx context.Context, id string) (*handoffv1.Budget, error) {
	vals, err := s.rdb.HMGet(ctx, s.key("wallet", id), "usd", "revisions", "hops").Result()
	if err != nil {
		return nil, s.errf("wallet %s: %w", id, err)
	}
	return s.walletFields(id, vals)
}

// WalletFor is one HMGET of the wallet's numbers and its job.
func (s *Redis) WalletFor(ctx context.Context, id, job string) (*handoffv1.Budget, error) {
	if job == "" {
		return nil, fmt.Errorf("store: wallet %s: empty job id", id)
	}
	vals, err := s.rdb.HMGet(ctx, s.key("wallet", id), "usd", "revisions", "hops", "job").Result()
	if err != nil {
		return nil, s.errf("wallet %s: %w", id, err)
	}
	if owner, _ := vals[3].(string); owner != job {
		if vals[0] == nil {
			return nil, s.errf("wallet %s: %w", id, ErrNotFound)
		}
		return nil, s.errf("wallet %s: %w", id, ErrWrongJob)
	}
	return s.walletFields(id, vals[:3])
}

// walletFields parses an HMGET of usd, revisions, hops (ErrNotFound when they are absent).
func (s *Redis) walletFields(id string, vals []any) (*handoffv1.Budget, error) {
	f := make([]string, len(vals))
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			return nil, s.errf("wallet %s: %w", id, ErrNotFound)
		}
		f[i] = str
	}
	out, err := parseBudget(f)
	if err != nil {
		return nil, s.errf("wallet %s: %w", id, err)
	}
	return out, nil
}

// ---- Idempotency ----

// Idempotency records are "P" followed by the claim's owner token (pending) or "D"
// followed by the stored value.
const (
	idemPending = "P"
	idemDone    = "D"
)

// heldLua defines held(key, owner, rec): how a call of owner finds idempotency record key:
// 'free' (absent, or owner's own pending marker: the call may write), 'same' (done with rec
// already), 'done' (done with another value) or 'other' (another owner's pending marker).
const heldLua = `
local function held(k, owner, rec)
  local cur = redis.call('GET', k)
  if not cur or cur == 'P' .. owner then return 'free' end
  if cur == rec then return 'same' end
  if cur:sub(1, 1) == 'D' then return 'done' end
  return 'other'
end
`

// releaseScript deletes the record only while it is owner's pending marker: a done record
// is never released, another owner's claim is left alone. KEYS: idem. ARGV: owner. Reply 1
// when deleted, 0 when there was nothing to release, -1 for another owner's claim.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == 'P' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
if v and v:sub(1, 1) == 'P' then return -1 end
return 0
`)

// completeScript stores the done record unless the key is held by another owner or done with
// another value. KEYS: idem. ARGV: owner, record, ttl ms (0: no expiry). Reply 1 when the
// key is done with the record afterwards, -1 (nothing written) otherwise.
var completeScript = redis.NewScript(heldLua + `
local h = held(KEYS[1], ARGV[1], ARGV[2])
if h == 'same' then return 1 end
if h ~= 'free' then return -1 end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
`)

// ttlMillis rounds d up to whole milliseconds (PX has no finer unit); 0 means no expiry.
func ttlMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func decodeIdemRecord(v string) (ClaimState, []byte, error) {
	switch {
	case strings.HasPrefix(v, idemPending): // its owner's token is not shown
		return Pending, nil, nil
	case strings.HasPrefix(v, idemDone):
		return Done, []byte(v[len(idemDone):]), nil
	}
	return 0, nil, fmt.Errorf("unrecognised idempotency record %.16q", v)
}

// Claim is Admit without a wallet: the same script, one round trip.
func (s *Redis) Claim(ctx context.Context, key string, pendingTTL time.Duration) (ClaimState, []byte, string, error) {
	a, err := s.Admit(ctx, key, pendingTTL, "", Debit{})
	if err != nil {
		return 0, nil, "", err
	}
	return a.State, a.Value, a.Owner, nil
}

// admitScript sets the pending marker if the key is free (SET NX, with PX when ttl > 0) and
// then, only for that fresh claim and only with a wallet key, runs debit: the runner's
// claim and hop debit in one round trip instead of two (Claim is this script without a
// wallet). A negative usd is refused before anything is written.
// A debit marks the wallet hash with the field "paid:<key>", and a key found marked is not
// debited again ({"claimed", "paid", usd, revisions, hops}): a wallet pays each key once.
// With a job (Debit.Job) the wallet's job is checked right after the claim, before the
// paid mark and the debit, so another job's wallet is refused ({"claimed", "wrongjob"})
// without a word of what it holds.
// With a verdict check (Debit.CheckVerdict) the wallet's verdicts are checked after the
// job (verdictLua), for a fresh claim ({"claimed", "reset"}) and for a done one ({"held",
// record, "reset"}), so a reset package is refused in this same round trip.
// The pending marker is "P" followed by the claim's owner token (ARGV[10]).
// KEYS: idem[, wallet]. ARGV: ttl ms, hops, revisions, usd, requireMoney, key, job,
// claimed verdict, check, owner.
// Reply: {"held", record[, "reset"]} | {"claimed"} | {"claimed", "notfound"|"wrongjob"|"reset"} |
// {"claimed", "paid", ...} | {"claimed", debit's reply...}.
var admitScript = redis.NewScript(debitLua + verdictLua + payLua + `
if KEYS[2] and ARGV[4]:sub(1, 1) == '-' then return {'negative'} end
local ok
if tonumber(ARGV[1]) > 0 then
  ok = redis.call('SET', KEYS[1], 'P' .. ARGV[10], 'NX', 'PX', ARGV[1])
else
  ok = redis.call('SET', KEYS[1], 'P' .. ARGV[10], 'NX')
end
if not ok then
  local rec = redis.call('GET', KEYS[1])
  if KEYS[2] and rec and rec:sub(1, 1) == 'D' and not jobRefused(KEYS[2], ARGV[7]) and resets(KEYS[2], ARGV[8], ARGV[9]) then
    return {'held', rec, 'reset'}
  end
  return {'held', rec}
end
if not KEYS[2] then return {'claimed'} end
return pay(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
`)

// payScript is admitScript's debit alone, for a claim made by admitScript without a wallet:
// on Redis Cluster the claim and the wallet are in different slots, so Admit runs the two
// halves one after the other. The paid mark keeps the second half once per key, so a claim
// retried after a crash between them does not pay twice.
// KEYS: wallet. ARGV: as admitScript's. Reply: as admitScript's after the claim.
var payScript = redis.NewScript(debitLua + verdictLua + payLua + `
if ARGV[4]:sub(1, 1) == '-' then return {'negative'} end
return pay(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
`)

// payLua defines pay(wallet key, hops, revisions, usd, requireMoney, key, job): the job
// check, the paid mark and the debit of a fresh claim, replying {"claimed", ...}. It reads
// every wallet field these rules look at in one HMGET (a wallet always holds usd, so EXISTS
// is asked only when none came back).
const payLua = `
local function pay(wkey, hops, revs, usd, requireMoney, key, job, claimed, check)
  local paid = 'paid:' .. key
  local f = redis.call('HMGET', wkey, 'usd', 'revisions', 'hops', 'job', 'vfailed', 'vlast', paid)
  local exists = f[1] or f[2] or f[3] or f[4] or f[5] or f[6] or f[7]
  if not exists then exists = redis.call('EXISTS', wkey) == 1 end
  local refused = refusal(f[4], exists, job)
  if refused then return {'claimed', refused} end
  if exists and resetsFrom(f[5], f[6], claimed, check) then return {'claimed', 'reset'} end
  if f[7] then return {'claimed', 'paid', f[1], f[2], f[3]} end
  local r = debitFrom(wkey, f[1], f[2], f[3], hops, revs, usd, requireMoney)
  if r[1] == 'ok' then redis.call('HSET', wkey, paid, '1') end
  table.insert(r, 1, 'claimed')
  return r
end
`

// luaFlags are a script's "0" and "1" arguments, boxed once: a string variable put in an
// []any is copied to the heap on every call.
var luaFlags = [2]any{"0", "1"}

func luaFlag(b bool) any {
	if b {
		return luaFlags[1]
	}
	return luaFlags[0]
}

func (s *Redis) Admit(ctx context.Context, key string, pendingTTL time.Duration, walletID string, d Debit) (Admission, error) {
	if key == "" {
		return Admission{}, fmt.Errorf("store: empty idempotency key")
	}
	keys := make([]string, 1, 2) // room for the wallet's: one allocation, not two
	keys[0] = s.key("idem", key)
	if walletID != "" {
		keys = append(keys, s.key("wallet", walletID))
	}
	owner := newOwner()
	args := []any{ttlMillis(pendingTTL), d.Hops, d.Revisions, d.USDMicros, luaFlag(d.RequireMoney), key, d.Job, int32(d.Verdict), luaFlag(d.CheckVerdict), owner}
	var res []string
	var err error
	if s.cluster && walletID != "" {
		if d.USDMicros < 0 {
			return Admission{}, errors.New("store: a debit cannot add money")
		}
		err = s.replicated(ctx, keys[0], func(c redis.Cmdable) error {
			res, err = admitScript.Run(ctx, c, keys[:1], args...).StringSlice()
			return err
		})
		if err == nil && len(res) == 1 && res[0] == "claimed" {
			res, err = payScript.Run(ctx, s.run, keys[1:], args...).StringSlice()
		}
		if err == nil && d.CheckVerdict && len(res) == 2 && res[0] == "held" && strings.HasPrefix(res[1], idemDone) {
			// The claim's slot cannot read the wallet's: a stored result is checked in a
			// script of its own (only on a cluster, only for a re-delivery).
			var n int
			if n, err = checkVerdictScript.Run(ctx, s.run, keys[1:], int32(d.Verdict), d.Job).Int(); err == nil && n == 1 {
				res = append(res, "reset")
			}
		}
	} else {
		err = s.replicated(ctx, keys[0], func(c redis.Cmdable) error {
			res, err = admitScript.Run(ctx, c, keys, args...).StringSlice()
			return err
		})
	}
	if err != nil {
		return Admission{}, s.errf("claim %q: %w", key, err)
	}
	bad := func() (Admission, error) {
		return Admission{}, s.errf("claim %q: unexpected script reply %q", key, res)
	}
	switch {
	case (len(res) == 2 || len(res) == 3 && res[2] == "reset") && res[0] == "held":
		st, val, err := decodeIdemRecord(res[1])
		if err != nil {
			return Admission{}, s.errf("claim %q: %w", key, err)
		}
		a := Admission{State: st, Value: val}
		if len(res) == 3 {
			a.DebitErr = ErrSilentReset
		}
		return a, nil
	case len(res) == 1 && res[0] == "negative":
		return Admission{}, errors.New("store: a debit cannot add money")
	case len(res) == 0 || res[0] != "claimed":
		return bad()
	case len(res) == 1:
		return Admission{State: Claimed, Owner: owner}, nil
	}
	a := Admission{State: Claimed, Owner: owner}
	switch res[1] {
	case "ok", "empty", "paid":
		if len(res) != 5 {
			return bad()
		}
		w, err := parseBudget(res[2:])
		if err != nil {
			return Admission{}, s.errf("claim %q: wallet %s: %w", key, walletID, err)
		}
		a.Wallet = w
		switch res[1] {
		case "ok":
			a.Debited = true
		case "paid":
			a.Debited, a.Paid = true, true
		default:
			a.DebitErr = ErrWalletEmpty
		}
	case "notfound":
		a.DebitErr = ErrNotFound
	case "wrongjob":
		a.DebitErr = ErrWrongJob
	case "reset":
		a.DebitErr = ErrSilentReset
	default:
		return bad()
	}
	return a, nil
}

// Unpay is one HDEL of the wallet's paid:<key> field.
func (s *Redis) Unpay(ctx context.Context, walletID, key string) error {
	if err := s.rdb.HDel(ctx, s.key("wallet", walletID), "paid:"+key).Err(); err != nil {
		return s.errf("unpay %q from wallet %s: %w", key, walletID, err)
	}
	return nil
}

// Complete is completeScript: the owner check and the SET in one step. SET without KEEPTTL
// drops the marker's expiry, so ttl <= 0 keeps the result forever.
func (s *Redis) Complete(ctx context.Context, key, owner string, value []byte, ttl time.Duration) error {
	if err := checkOwned("complete", key, owner); err != nil {
		return err
	}
	rec := make([]byte, 0, len(idemDone)+len(value))
	rec = append(append(rec, idemDone...), value...)
	k := s.key("idem", key)
	var n int64
	if err := s.replicated(ctx, k, func(c redis.Cmdable) error {
		var err error
		n, err = completeScript.Run(ctx, c, []string{k}, owner, rec, ttlMillis(ttl)).Int64()
		return err
	}); err != nil {
		return s.errf("complete %q: %w", key, err)
	}
	if n < 0 {
		return s.errf("complete %q: %w", key, ErrNotOwner)
	}
	return nil
}

func (s *Redis) Release(ctx context.Context, key, owner string) error {
	if err := checkOwned("release", key, owner); err != nil {
		return err
	}
	n, err := releaseScript.Run(ctx, s.run, []string{s.key("idem", key)}, owner).Int64()
	if err != nil {
		return s.errf("release %q: %w", key, err)
	}
	if n < 0 {
		return s.errf("release %q: %w", key, ErrNotOwner)
	}
	return nil
}

// renewClaimScript moves owner's pending marker's expiry (compare, then PEXPIRE): one command
// of the server's per renewal. KEYS: idem. ARGV: ttl ms, owner. Reply 1 when renewed, 0 when
// the key is not pending, -1 when it is another owner's claim.
var renewClaimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == 'P' .. ARGV[2] then return redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
if v and v:sub(1, 1) == 'P' then return -1 end
return 0
`)

func (s *Redis) RenewClaim(ctx context.Context, key, owner string, pendingTTL time.Duration) (bool, error) {
	if key == "" || pendingTTL <= 0 {
		return false, fmt.Errorf("store: renew claim %q: the key must not be empty and the ttl must be positive (got %s)", key, pendingTTL)
	}
	if err := checkOwned("renew claim", key, owner); err != nil {
		return false, err
	}
	n, err := renewClaimScript.Run(ctx, s.run, []string{s.key("idem", key)}, ttlMillis(pendingTTL), owner).Int64()
	if err != nil {
		return false, s.errf("renew claim %q: %w", key, err)
	}
	if n < 0 {
		return false, s.errf("renew claim %q: %w", key, ErrNotOwner)
	}
	return n == 1, nil
}

func (s *Redis) Lookup(ctx context.Context, key string) (ClaimState, []byte, error) {
	v, err := s.rdb.Get(ctx, s.key("idem", key)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, s.errf("lookup %q: %w", key, err)
	}
	st, val, err := decodeIdemRecord(v)
	if err != nil {
		return 0, nil, s.errf("lookup %q: %w", key, err)
	}
	return st, val, nil
}
