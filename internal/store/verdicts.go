package store

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// A job run's verdicts, kept beside its wallet (same id, same Redis slot), so a receiver
// that admits a hop (Admit) can refuse, in the same round trip, a package that starts as if
// a failed judge had passed: the silent reset.

// ErrSilentReset is Admission.DebitErr for a package that, after a FAIL was recorded for
// its wallet (RecordVerdict), carries no evaluator.last_verdict, or claims a PASS no judge
// gave since (the last recorded verdict is not PASS). Nothing was taken.
var ErrSilentReset = errors.New("the package starts as if a failed judge had passed")

// Verdicts records the judges' verdicts of a job run.
type Verdicts interface {
	// RecordVerdict records verdict v (a judge's, or a person's PASS) for wallet id: the
	// run's last verdict, and that it failed once if v is FAIL. ErrNotFound when there is
	// no such wallet. Recording the same verdict again changes nothing.
	RecordVerdict(ctx context.Context, id string, v handoffv1.Verdict) error
	// ResetsVerdict reports, in one read, whether a package of job claiming verdict
	// claimed is a silent reset for wallet id (what Admit's check refuses): false for a
	// wallet that is not job's, or none. AgentRunnerService/Check asks it, so Check answers
	// what Deliver would.
	ResetsVerdict(ctx context.Context, id, job string, claimed handoffv1.Verdict) (bool, error)
}

// verdictState is what is kept per wallet: whether a FAIL was ever recorded, and the last
// verdict.
type verdictState struct {
	failed bool
	last   handoffv1.Verdict
}

// resets is the silent-reset rule: after a FAIL, a package must carry a verdict, and a PASS
// only when the last verdict given was a PASS.
func (s verdictState) resets(claimed handoffv1.Verdict) bool {
	if !s.failed {
		return false
	}
	return claimed == handoffv1.Verdict_VERDICT_UNSPECIFIED ||
		(claimed == handoffv1.Verdict_VERDICT_PASS && s.last != handoffv1.Verdict_VERDICT_PASS)
}

// bucketVerdicts: wallet id -> {failed byte, last verdict byte}. Created by the first
// RecordVerdict (an older file has none: no verdicts recorded).
var bucketVerdicts = []byte("verdicts")

func boltVerdicts(tx *bolt.Tx, id string) verdictState {
	b := getIn(tx, bucketVerdicts, id)
	if len(b) != 2 {
		return verdictState{}
	}
	return verdictState{failed: b[0] == 1, last: handoffv1.Verdict(b[1])}
}

func (s *Bolt) ResetsVerdict(_ context.Context, id, job string, claimed handoffv1.Verdict) (bool, error) {
	var reset bool
	err := s.db.View(func(tx *bolt.Tx) error {
		if walletJobOK(tx, id, job) != nil {
			return nil
		}
		reset = boltVerdicts(tx, id).resets(claimed)
		return nil
	})
	return reset, err
}

func (s *Bolt) RecordVerdict(_ context.Context, id string, v handoffv1.Verdict) error {
	return s.update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketWallets).Get([]byte(id)) == nil {
			return ErrNotFound
		}
		st := boltVerdicts(tx, id)
		st.failed = st.failed || v == handoffv1.Verdict_VERDICT_FAIL
		st.last = v
		failed := byte(0)
		if st.failed {
			failed = 1
		}
		return putIn(tx, bucketVerdicts, id, string([]byte{failed, byte(st.last)}))
	})
}

// verdictLua defines resets(wallet key, claimed verdict, check): the rule of
// verdictState.resets on the wallet hash's fields "vfailed" and "vlast"; check "0" means
// the caller asked for no check. resetsFrom is the rule on fields already read.
const verdictLua = `
local function resetsFrom(vfailed, vlast, claimed, check)
  if check ~= '1' or vfailed ~= '1' then return false end
  if claimed == '0' then return true end
  return claimed == '1' and vlast ~= '1'
end
local function resets(wkey, claimed, check)
  if check ~= '1' then return false end
  local v = redis.call('HMGET', wkey, 'vfailed', 'vlast')
  return resetsFrom(v[1], v[2], claimed, check)
end
`

// recordVerdictScript: KEYS wallet; ARGV verdict number. Reply 1, or 0 for no wallet.
var recordVerdictScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '2' then redis.call('HSET', KEYS[1], 'vfailed', '1') end
redis.call('HSET', KEYS[1], 'vlast', ARGV[1])
return 1
`)

// checkVerdictScript is the verdict check alone: for a held key on Redis Cluster (where the
// claim's script cannot read the wallet's slot), and for Check (ResetsVerdict). KEYS wallet; ARGV claimed, job. Reply 1
// when the package resets, 0 otherwise (also for another job's wallet: nothing is said).
var checkVerdictScript = redis.NewScript(debitLua + verdictLua + `
if jobRefused(KEYS[1], ARGV[2]) then return 0 end
if resets(KEYS[1], ARGV[1], '1') then return 1 end
return 0
`)

func (s *Redis) ResetsVerdict(ctx context.Context, id, job string, claimed handoffv1.Verdict) (bool, error) {
	n, err := checkVerdictScript.Run(ctx, s.run, []string{s.key("wallet", id)}, int32(claimed), job).Int()
	if err != nil {
		return false, s.errf("check the verdicts of wallet %s: %w", id, err)
	}
	return n == 1, nil
}

func (s *Redis) RecordVerdict(ctx context.Context, id string, v handoffv1.Verdict) error {
	n, err := recordVerdictScript.Run(ctx, s.run, []string{s.key("wallet", id)}, int32(v)).Int()
	if err != nil {
		return s.errf("record verdict of wallet %s: %w", id, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}
