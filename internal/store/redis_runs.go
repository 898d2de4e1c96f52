package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// runBuckets is how many index buckets runs are spread over: each is a sorted set in its own
// slot, so on Redis Cluster creating runs writes to every shard rather than to one hot index.
// Changing it would strand the runs indexed in the buckets it drops.
const runBuckets = 16

// bucketKey is the index bucket a run is listed in, chosen by its run id.
func (s *Redis) bucketKey(runID string) string {
	h := fnv.New32a()
	h.Write([]byte(runID))
	return s.bucket(int(h.Sum32() % runBuckets))
}

func (s *Redis) bucket(b int) string { return s.key("index", "runs:"+strconv.Itoa(b)) }

// reserveRequestScript records which run a request id creates (with ARGV[3] "1"; "0" only
// looks), unless it is recorded: then it replies {"dup", run_id, request digest or "" when
// none was recorded}, or {"reqconflict"} when the digest differs. KEYS: request, requestsum
// (one slot: the request id's). ARGV: run_id, request digest, record. Reply: {"reserved"} |
// {"free"} (looking only) | {"dup", ...} | {"reqconflict"}.
var reserveRequestScript = redis.NewScript(`
local prev = redis.call('GET', KEYS[1])
if prev then
  local sum = redis.call('GET', KEYS[2])
  if sum and sum ~= ARGV[2] then return {'reqconflict'} end
  return {'dup', prev, sum or ''}
end
if ARGV[3] ~= '1' then return {'free'} end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return {'reserved'}
`)

// unreserveScript deletes a request's reservation while it names the given run (compare and
// delete). KEYS: request, requestsum. ARGV: run_id.
var unreserveScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1], KEYS[2]) end
return 0
`)

// jobSumScript compares a job's content digest with the one recorded for its job id and,
// with ARGV[2] "1", records it when none is. KEYS: jobsum. ARGV: digest, record. Reply: "ok"
// or "jobconflict".
var jobSumScript = redis.NewScript(jobSumLua + `
return jobSum(KEYS[1], ARGV[1], ARGV[2])
`)

// jobSumLua defines jobSum(key, digest, record), jobSumScript's steps on its key and
// arguments, for the scripts that run them.
const jobSumLua = `
local function jobSum(key, digest, record)
  local sum = redis.call('GET', key)
  if sum and sum ~= digest then return 'jobconflict' end
  if not sum and record == '1' then redis.call('SET', key, digest) end
  return 'ok'
end
`

// indexRunScript lists a run in its index bucket, unless it is listed, with the server's
// time in microseconds as its score, raised past the bucket's newest so scores in one
// bucket are unique and increase. KEYS: bucket. ARGV: run_id. Reply: 1 when listed now.
var indexRunScript = redis.NewScript(indexRunLua + `
return indexRun(KEYS[1], ARGV[1])
`)

// indexRunLua defines indexRun(bucket, runID), indexRunScript's steps, for the scripts that
// run them.
const indexRunLua = `
local function indexRun(bucket, runID)
  if redis.call('ZSCORE', bucket, runID) then return 0 end
  local t = redis.call('TIME')
  local s = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local top = redis.call('ZREVRANGE', bucket, 0, 0, 'WITHSCORES')
  if top[2] and tonumber(top[2]) >= s then s = tonumber(top[2]) + 1 end
  redis.call('ZADD', bucket, string.format('%.0f', s), runID)
  return 1
end
`

// createRunScript stores a run, opens its wallet (when given, as openWalletScript) and
// appends its first events, unless its run id is taken ({"exists"}) or its wallet id is
// another job's wallet ({"wrongjob"}); every check comes before the first write.
// KEYS: run, events, wallet (one slot: the run id's). ARGV: Job bytes, "1" when a wallet is
// given (else "0"), usd, revisions, hops, job_id, event bytes... Reply on success:
// {"created", the timeline's length after the events}.
var createRunScript = redis.NewScript(createRunLua(0, 0))

// createRunLua is createRunScript's body with its keys from KEYS[k+1] and its arguments from
// ARGV[a+1], so that createRunOneScript runs the very same steps after its own.
func createRunLua(k, a int) string {
	key := func(i int) string { return fmt.Sprintf("KEYS[%d]", k+i) }
	arg := func(i int) string { return fmt.Sprintf("ARGV[%d]", a+i) }
	return strings.NewReplacer(
		"RUN", key(1), "EVENTS", key(2), "WALLET", key(3),
		"JOBBYTES", arg(1), "HASWALLET", arg(2), "USD", arg(3), "REVISIONS", arg(4), "HOPS", arg(5), "JOBID", arg(6),
		"FIRSTEVENT", strconv.Itoa(a+7),
	).Replace(`
if redis.call('EXISTS', RUN) == 1 then return {'exists'} end
local walletExists = redis.call('EXISTS', WALLET) == 1
if HASWALLET == '1' and walletExists then
  local owner = redis.call('HGET', WALLET, 'job')
  if owner and owner ~= JOBID then return {'wrongjob'} end
end
redis.call('SET', RUN, JOBBYTES)
if HASWALLET == '1' then
  if walletExists then
    redis.call('HSETNX', WALLET, 'job', JOBID)
  else
    redis.call('HSET', WALLET, 'usd', USD, 'revisions', REVISIONS, 'hops', HOPS, 'job', JOBID)
  end
end
local n = 0
for i = FIRSTEVENT, #ARGV do n = redis.call('RPUSH', EVENTS, ARGV[i]) end
return {'created', tostring(n)}
`)
}

// createRunOneScript is CreateRun's steps 4 to 6 (no request id) in one script, for one
// Redis, where the job's digest, the index bucket and the run's keys (three slots) are
// reachable from one script: the digest checked and recorded (jobSumScript), the run
// listed (indexRunScript), then stored with its wallet and events (createRunScript), in that
// order, as the separate scripts would. KEYS: jobsum, bucket, run, events, wallet. ARGV:
// digest ("" when the job has no job_id: not checked), run_id, then createRunScript's ARGV.
// Reply: {"jobconflict"} or createRunScript's.
var createRunOneScript = redis.NewScript(jobSumLua + indexRunLua + createRunOneLua(0, 0))

// createRunOneLua is createRunOneScript's body with its keys from KEYS[k+1] and its
// arguments from ARGV[a+1].
func createRunOneLua(k, a int) string {
	return fmt.Sprintf(`
if ARGV[%[2]d] ~= '' and jobSum(KEYS[%[1]d], ARGV[%[2]d], '1') == 'jobconflict' then return {'jobconflict'} end
indexRun(KEYS[%[3]d], ARGV[%[4]d])`, k+1, a+1, k+2, a+2) + createRunLua(k+2, a+2)
}

// The scripts CreateRunLeased runs on one Redis: createRunScript and createRunOneScript,
// each creating the run holding its lease at its first epoch (leasedLua). KEYS: lease,
// lease index bucket, fence, then the script's own. ARGV: owner, ttl in ms, lease name,
// then the script's own. Reply: the script's, with the epoch appended to {"created", n}.
var (
	createRunLeasedScript    = redis.NewScript(leasedLua(createRunLua(3, 3)))
	createRunOneLeasedScript = redis.NewScript(jobSumLua + indexRunLua + leasedLua(createRunOneLua(3, 3)))
)

// CreateRun is up to six scripts, each on the keys of one slot, in an order that a crash
// between any two of them leaves safe to retry:
//
//  1. the request id (when given): look it up; a recorded one answers the call (its run, or
//     ErrRequestConflict), whatever else differs;
//  2. the job id (when given): refuse content other than its recorded digest's;
//  3. the request id again: reserve it for this run id (or, if another caller just did,
//     answer as in 1);
//  4. the job id again: record its digest when none is (a job created with other content
//     between 2 and 4 is refused after all, and the reservation of 3 undone);
//  5. the index: list the run id in its bucket (ListRuns skips a listed run that was never
//     stored);
//  6. the run: store it, its wallet and its first events (refused: the reservation of 3 is
//     undone).
//
// A request whose reserved run is not stored (its creator stopped after 3, or is between 3
// and 6 now) is finished by whoever retries it, under the reserved run id; when two finish
// it at once, one creates the run and the other returns it. A job digest recorded in step 4
// stays recorded even when step 6 then refuses (a taken run id, another job's wallet): the
// job id's content is fixed by its first attempt. On one Redis the same scripts run, so
// both behave alike; there a run without a request id is steps 4 to 6 in one script
// (createRunOneScript), in the same order.
func (s *Redis) CreateRun(ctx context.Context, job *handoffv1.Job, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, error) {
	run, created, _, err := s.createRun(ctx, job, nil, evs)
	return run, created, err
}

// CreateRunLeased is CreateRun, and on one Redis the script that stores the run takes its
// lease and first epoch after it (leasedLua): one round trip fewer on every new job's path.
// A cluster holds the run's keys, the lease's and its index's in different slots, which no
// one script may span: there the run is created as by CreateRun and no lease is taken
// (epoch 0), and the caller takes it as it would without a RunLeaser. So does a fence whose
// INCR failed (the lease is then the caller's, and its own AcquireLeaseFence reports that).
func (s *Redis) CreateRunLeased(ctx context.Context, job *handoffv1.Job, lease LeaseClaim, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, uint64, error) {
	if err := checkLease(lease.Name, lease.Owner, lease.TTL, true); err != nil {
		return nil, false, 0, err
	}
	if s.cluster {
		run, created, err := s.CreateRun(ctx, job, evs...)
		return run, created, 0, err
	}
	return s.createRun(ctx, job, &lease, evs)
}

// createRun is CreateRun, creating the run holding lease when it is not nil (one Redis
// only: see CreateRunLeased).
func (s *Redis) createRun(ctx context.Context, job *handoffv1.Job, lease *LeaseClaim, evs []*handoffv1.JobEvent) (*handoffv1.Job, bool, uint64, error) {
	if job.GetRunId() == "" {
		return nil, false, 0, fmt.Errorf("store: run_id is empty")
	}
	if job.GetWallet() != nil && job.GetJobId() == "" {
		return nil, false, 0, fmt.Errorf("store: run %s has a wallet but no job_id to record in it", job.GetRunId())
	}
	rid, given := job.GetRequestId(), job.GetRunId()
	jobSum := func(record string) error {
		if job.GetJobId() == "" {
			return nil
		}
		res, err := jobSumScript.Run(ctx, s.run, []string{s.key("jobsum", job.GetJobId())}, JobDigest(job), record).Text()
		if err != nil {
			return s.errf("create run %s: job %s: %w", given, job.GetJobId(), err)
		}
		if res == "jobconflict" {
			return s.errf("create run %s: job %s: %w", given, job.GetJobId(), ErrJobConflict)
		}
		return nil
	}
	if rid == "" && !s.cluster {
		return s.createRunOne(ctx, job, lease, evs)
	}
	reserved := false
	unreserve := func() {
		if reserved { // best effort: a reservation left names a run never stored, which a retry finishes
			unreserveScript.Run(context.WithoutCancel(ctx), s.run, []string{s.key("request", rid), s.key("requestsum", rid)}, given)
		}
	}
	// The request is looked up first (a request id used again is told by it, whatever else
	// differs), then the job checked, then the request reserved. Without a request id there
	// is nothing to look up or reserve, and the job's check is the one that records its
	// digest (4: the script checks before it records), so 1 to 3 are skipped.
	if rid != "" {
		for _, record := range []string{"0", "1"} {
			if record == "1" {
				if err := jobSum("0"); err != nil {
					return nil, false, 0, err
				}
			}
			res, err := reserveRequestScript.Run(ctx, s.run, []string{s.key("request", rid), s.key("requestsum", rid)},
				job.GetRunId(), RequestDigest(job), record).StringSlice()
			if err != nil {
				return nil, false, 0, s.errf("create run %s: request %s: %w", given, rid, err)
			}
			switch {
			case len(res) == 1 && res[0] == "free":
			case len(res) == 1 && res[0] == "reserved":
				reserved = true
			case len(res) == 1 && res[0] == "reqconflict":
				return nil, false, 0, s.errf("create run %s: request %s: %w", given, rid, ErrRequestConflict)
			case len(res) == 3 && res[0] == "dup":
				prev, err := s.GetRun(ctx, res[1])
				if err == nil {
					if res[2] == "" && !SameIntake(prev, job) { // recorded before requests had digests
						return nil, false, 0, s.errf("create run %s: request %s: %w", given, rid, ErrRequestConflict)
					}
					return prev, false, 0, nil
				}
				if !errors.Is(err, ErrNotFound) || res[2] == "" {
					return nil, false, 0, s.errf("create run %s: earlier run %s for request %s: %w", given, res[1], rid, err)
				}
				// Reserved but not stored: finish that creation, with this request's content
				// (the same digest) under the reserved run id.
				job = proto.Clone(job).(*handoffv1.Job)
				job.RunId = res[1]
			default:
				return nil, false, 0, s.errf("create run %s: unexpected script reply %q", given, res)
			}
		}
	}
	runID := job.GetRunId()
	if runID != given {
		lease = nil // the lease is for the run asked for; the caller takes the reserved run's
	}
	if err := jobSum("1"); err != nil {
		unreserve()
		return nil, false, 0, err
	}
	if err := indexRunScript.Run(ctx, s.run, []string{s.bucketKey(runID)}, runID).Err(); err != nil {
		return nil, false, 0, s.errf("create run %s: index: %w", runID, err)
	}
	args, err := createRunArgs(nil, job, evs)
	if err != nil {
		return nil, false, 0, err
	}
	res, err := s.runCreate(ctx, createRunScript, createRunLeasedScript, lease, runID,
		[]string{s.key("run", runID), s.key("events", runID), s.key("wallet", runID)}, args)
	if err != nil {
		return nil, false, 0, s.errf("create run %s: %w", runID, err)
	}
	switch res[0] {
	case "created":
		return s.created(job, evs, res)
	case "exists":
		// Stored by another caller finishing this same request: the request's run.
		if prev, err := s.GetRun(ctx, runID); err == nil && rid != "" && prev.GetRequestId() == rid {
			return prev, false, 0, nil
		}
		unreserve()
		return nil, false, 0, s.errf("create run %s: run already exists", runID)
	case "wrongjob":
		unreserve()
		return nil, false, 0, s.errf("create run %s: its wallet id is a wallet of another job: %w", runID, ErrWrongJob)
	case "leasetype":
		unreserve()
		return nil, false, 0, s.leaseTypeErr(runID, lease, res)
	}
	return nil, false, 0, s.errf("create run %s: unexpected script reply %q", runID, res)
}

// createRunOne is CreateRun of a run without a request id on one Redis: createRunOneScript.
func (s *Redis) createRunOne(ctx context.Context, job *handoffv1.Job, lease *LeaseClaim, evs []*handoffv1.JobEvent) (*handoffv1.Job, bool, uint64, error) {
	runID := job.GetRunId()
	digest := ""
	if job.GetJobId() != "" {
		digest = JobDigest(job)
	}
	args, err := createRunArgs([]any{digest, runID}, job, evs)
	if err != nil {
		return nil, false, 0, err
	}
	keys := []string{s.key("jobsum", job.GetJobId()), s.bucketKey(runID), s.key("run", runID), s.key("events", runID), s.key("wallet", runID)}
	res, err := s.runCreate(ctx, createRunOneScript, createRunOneLeasedScript, lease, runID, keys, args)
	if err != nil {
		return nil, false, 0, s.errf("create run %s: %w", runID, err)
	}
	switch {
	case len(res) == 1 && res[0] == "jobconflict":
		return nil, false, 0, s.errf("create run %s: job %s: %w", runID, job.GetJobId(), ErrJobConflict)
	case len(res) == 1 && res[0] == "exists":
		return nil, false, 0, s.errf("create run %s: run already exists", runID)
	case len(res) == 1 && res[0] == "wrongjob":
		return nil, false, 0, s.errf("create run %s: its wallet id is a wallet of another job: %w", runID, ErrWrongJob)
	case len(res) >= 2 && res[0] == "created":
		return s.created(job, evs, res)
	case len(res) == 2 && res[0] == "leasetype":
		return nil, false, 0, s.leaseTypeErr(runID, lease, res)
	}
	return nil, false, 0, s.errf("create run %s: unexpected script reply %q", runID, res)
}

// createRunArgs is createRunScript's ARGV for job and its first events, after the
// arguments given before it (createRunOneScript's own).
func createRunArgs(before []any, job *handoffv1.Job, evs []*handoffv1.JobEvent) ([]any, error) {
	data, err := proto.Marshal(job)
	if err != nil {
		return nil, fmt.Errorf("store: encode run %s: %w", job.GetRunId(), err)
	}
	b := job.GetWallet()
	return appendEncoded(append(before, data, luaFlag(b != nil), b.GetUsdRemainingMicros(), b.GetRevisionsRemaining(), b.GetHopsRemaining(),
		job.GetJobId()), job.GetRunId(), evs)
}

// created is CreateRun's answer to createRunScript's {"created", timeline length} (and the
// run's epoch after them, from a leased script): the events numbered by where they landed,
// the run as stored, and the epoch (0 for none, or for a fence that failed: -1).
func (s *Redis) created(job *handoffv1.Job, evs []*handoffv1.JobEvent, res []string) (*handoffv1.Job, bool, uint64, error) {
	if len(evs) > 0 && len(res) > 1 {
		last, err := strconv.ParseUint(res[1], 10, 64)
		if err != nil {
			return nil, false, 0, s.errf("create run %s: unexpected script reply %q", job.GetRunId(), res)
		}
		numberEvents(evs, last)
	}
	var epoch uint64
	if len(res) > 2 {
		e, err := strconv.ParseInt(res[2], 10, 64)
		if err != nil {
			return nil, false, 0, s.errf("create run %s: unexpected script reply %q", job.GetRunId(), res)
		}
		epoch = uint64(max(e, 0))
	}
	return proto.Clone(job).(*handoffv1.Job), true, epoch, nil
}

// leaseTypeErr is the error for a leased script's {"leasetype", type}: the lease key holds
// another kind of value, and nothing was written.
func (s *Redis) leaseTypeErr(runID string, lease *LeaseClaim, res []string) error {
	if lease == nil || len(res) < 2 {
		return s.errf("create run %s: unexpected script reply %q", runID, res)
	}
	return s.errf("create run %s: lease %s holds a %s, not a lease; nothing was written", runID, lease.Name, res[1])
}

// runCreate runs script, or with a lease leased (the same steps, then the lease taken:
// leasedLua) with the lease's keys and arguments before keys and args.
func (s *Redis) runCreate(ctx context.Context, script, leased *redis.Script, lease *LeaseClaim, runID string, keys []string, args []any) ([]string, error) {
	if lease == nil {
		return script.Run(ctx, s.run, keys, args...).StringSlice()
	}
	keys = append([]string{s.key("lease", lease.Name), s.leaseBucket(lease.Name), s.key("fence", runID)}, keys...)
	args = append([]any{lease.Owner, ttlMillis(lease.TTL), lease.Name}, args...)
	return leased.Run(ctx, s.run, keys, args...).StringSlice()
}

// indexed is one run of an index bucket.
type indexed struct {
	score int64
	id    string
}

// before orders listed runs newest first: by score down, then run id down (the order
// ZREVRANGEBYSCORE gives within one bucket).
func before(a, b indexed) int {
	if c := cmp.Compare(b.score, a.score); c != 0 {
		return c
	}
	return strings.Compare(b.id, a.id)
}

// parsePageToken reads a ListRuns token: "score:run_id" of the last run of the page before
// (exclusive); "" and "0" are the first page.
func parsePageToken(after string) (*indexed, error) {
	if after == "" || after == "0" {
		return nil, nil
	}
	sc, id, ok := strings.Cut(after, ":")
	n, err := strconv.ParseInt(sc, 10, 64)
	if !ok || err != nil || id == "" {
		return nil, fmt.Errorf("store: bad page token %q", after)
	}
	return &indexed{score: n, id: id}, nil
}

// ListRuns merges the index buckets newest first, reading them and then the runs in batches
// (one pipelined round trip each) until limit matching runs and one more are found. It is
// not one snapshot, but runs are never deleted and a run's score never changes, so a page
// holds every run once; only a state read may be newer than the index read. Newest is by
// the clock of the server holding each bucket, and a run listed but never stored (its
// CreateRun stopped between indexing and storing it) is skipped.
func (s *Redis) ListRuns(ctx context.Context, state handoffv1.JobState, limit int, after string) ([]*handoffv1.Job, string, error) {
	if limit <= 0 {
		limit = 100
	}
	cur, err := parsePageToken(after)
	if err != nil {
		return nil, "", err
	}
	batch := limit + 1
	if state != handoffv1.JobState_JOB_STATE_UNSPECIFIED {
		batch = max(batch, 256) // most runs may not match: read ahead
	}
	batch = min(batch, 1000)
	var out []*handoffv1.Job
	for {
		// Each bucket's next batch+1 (one of them may be the cursor itself): the merged
		// first batch are then all runs after the cursor, whatever buckets they are in.
		maxScore := "+inf"
		if cur != nil {
			maxScore = strconv.FormatInt(cur.score, 10)
		}
		pipe := s.rdb.Pipeline()
		zs := make([]*redis.ZSliceCmd, runBuckets)
		for b := range runBuckets {
			zs[b] = pipe.ZRevRangeByScoreWithScores(ctx, s.bucket(b), &redis.ZRangeBy{Max: maxScore, Min: "-inf", Count: int64(batch + 1)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, "", s.errf("list runs: %w", err)
		}
		var merged []indexed
		more := false
		for _, z := range zs {
			more = more || len(z.Val()) == batch+1
			for _, e := range z.Val() {
				x := indexed{score: int64(e.Score), id: e.Member.(string)}
				if cur == nil || before(*cur, x) < 0 {
					merged = append(merged, x)
				}
			}
		}
		slices.SortFunc(merged, before)
		if len(merged) > batch {
			merged, more = merged[:batch], true
		}
		if len(merged) == 0 {
			return out, "", nil
		}
		pipe = s.rdb.Pipeline()
		gets := make([]*redis.StringCmd, len(merged))
		for i, x := range merged {
			gets[i] = pipe.Get(ctx, s.key("run", x.id))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, "", s.errf("list runs: %w", err)
		}
		for i, x := range merged {
			data, err := gets[i].Bytes()
			if errors.Is(err, redis.Nil) {
				continue // listed, never stored
			}
			if err != nil {
				return nil, "", s.errf("list runs: run %s (indexed): %w", x.id, err)
			}
			j, err := decodeJob(data)
			if err != nil {
				return nil, "", err
			}
			if state != handoffv1.JobState_JOB_STATE_UNSPECIFIED && j.GetState() != state {
				continue
			}
			if len(out) == limit {
				last := merged[i-1]
				if i == 0 {
					last = *cur
				}
				return out, strconv.FormatInt(last.score, 10) + ":" + last.id, nil
			}
			out = append(out, j)
		}
		if !more {
			return out, "", nil
		}
		last := merged[len(merged)-1]
		cur = &last
	}
}
