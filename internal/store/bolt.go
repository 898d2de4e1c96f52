package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

var (
	bucketRuns     = []byte("runs")     // run_id -> Job
	bucketRunIndex = []byte("runindex") // creation seq (big endian) -> run_id, for newest-first listing
	bucketRequests = []byte("requests") // request_id -> run_id
	bucketEvents   = []byte("events")   // run_id -> bucket{seq -> JobEvent}
	bucketIdem     = []byte("idem")     // key -> idemRecord
	bucketLedger   = []byte("ledger")   // seq -> LedgerEntry (JSON)
	bucketWallets  = []byte("wallets")  // wallet id -> Budget
	bucketPaid     = []byte("paid")     // wallet id NUL idempotency key -> 1: Admit debited that hop
	bucketGrants   = []byte("grants")   // wallet id NUL grant key -> 1: GrantWallet added that grant
)

// Bolt is the embedded Store on one bbolt file. bbolt serialises write transactions, which
// is what makes Claim atomic across goroutines of one process. One file has one process.
type Bolt struct {
	db     *bolt.DB
	now    func() time.Time
	commit committer // group commit of write transactions (bolt_commit.go)
}

// ErrHeld: another process has the bbolt file open (one file has one process).
var ErrHeld = errors.New("another process holds the store")

// lockWait is how long Open waits for another process to let the file go (one that is
// stopping), before it says who holds it.
var lockWait = 5 * time.Second

// Open opens (or creates) the bbolt store at path.
func Open(path string) (*Bolt, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockWait})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open store %s: %w (waited %s for its lock): another handoff up, or a service, runs on the same folder; stop it or use another --data/--store", path, ErrHeld, lockWait)
	}
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRuns, bucketRunIndex, bucketRequests, bucketEvents, bucketIdem, bucketLedger, bucketWallets, bucketPaid, bucketGrants} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return reclaim(tx, time.Now()) // bolt_reclaim.go: we hold the file's lock, so no holder lives
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init store %s: %w", path, err)
	}
	s := &Bolt{db: db, now: time.Now}
	s.commit.idle = sync.NewCond(&s.commit.mu)
	return s, nil
}

// Close waits for the write being committed, refuses later ones, and closes the file.
func (s *Bolt) Close() error {
	s.closeCommits()
	return s.db.Close()
}

func (s *Bolt) Ping(context.Context) error {
	return s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketRuns) == nil {
			return fmt.Errorf("store: runs bucket missing")
		}
		return nil
	})
}

func u64(n uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, n)
	return b
}

func (s *Bolt) CreateRun(_ context.Context, job *handoffv1.Job, evs ...*handoffv1.JobEvent) (*handoffv1.Job, bool, error) {
	run, created, _, err := s.createRun(job, nil, evs)
	return run, created, err
}

// createRun is CreateRun, and with lease CreateRunLeased: the run it creates takes the
// lease and its first epoch in the transaction that creates it.
func (s *Bolt) createRun(job *handoffv1.Job, lease *LeaseClaim, evs []*handoffv1.JobEvent) (*handoffv1.Job, bool, uint64, error) {
	if job.GetRunId() == "" {
		return nil, false, 0, fmt.Errorf("store: run_id is empty")
	}
	if job.GetWallet() != nil && job.GetJobId() == "" {
		return nil, false, 0, fmt.Errorf("store: run %s has a wallet but no job_id to record in it", job.GetRunId())
	}
	if lease != nil {
		if err := checkLease(lease.Name, lease.Owner, lease.TTL, true); err != nil {
			return nil, false, 0, err
		}
	}
	jobSum, reqSum := JobDigest(job), RequestDigest(job)
	encs, err := encodeEvents(evs)
	if err != nil {
		return nil, false, 0, fmt.Errorf("store: encode event for run %s: %w", job.GetRunId(), err)
	}
	var out *handoffv1.Job
	created, legacy := false, false
	var last, epoch uint64
	err = s.update(func(tx *bolt.Tx) error {
		out, created, legacy, epoch = nil, false, false, 0
		runs := tx.Bucket(bucketRuns)
		if rid := job.GetRequestId(); rid != "" {
			if prev := tx.Bucket(bucketRequests).Get([]byte(rid)); prev != nil {
				sum := getIn(tx, bucketRequestSums, rid)
				if sum != nil && string(sum) != reqSum {
					return fmt.Errorf("store: request %s: %w", rid, ErrRequestConflict)
				}
				j, err := decodeJob(runs.Get(prev))
				if err != nil {
					return err
				}
				out, legacy = j, sum == nil
				return nil
			}
		}
		if err := checkSubmit(tx, job.GetJobId(), jobSum); err != nil {
			return err
		}
		if runs.Get([]byte(job.GetRunId())) != nil {
			return fmt.Errorf("store: run %s already exists", job.GetRunId())
		}
		data, err := proto.Marshal(job)
		if err != nil {
			return err
		}
		if err := runs.Put([]byte(job.GetRunId()), data); err != nil {
			return err
		}
		idx := tx.Bucket(bucketRunIndex)
		seq, err := idx.NextSequence()
		if err != nil {
			return err
		}
		if err := idx.Put(u64(seq), []byte(job.GetRunId())); err != nil {
			return err
		}
		if rid := job.GetRequestId(); rid != "" {
			if err := tx.Bucket(bucketRequests).Put([]byte(rid), []byte(job.GetRunId())); err != nil {
				return err
			}
			if err := putIn(tx, bucketRequestSums, rid, reqSum); err != nil {
				return err
			}
		}
		if jid := job.GetJobId(); jid != "" && getIn(tx, bucketJobSums, jid) == nil {
			if err := putIn(tx, bucketJobSums, jid, jobSum); err != nil {
				return err
			}
		}
		if b := job.GetWallet(); b != nil {
			if _, err := openWalletTx(tx, job.GetRunId(), job.GetJobId(), b); err != nil {
				return err
			}
		}
		if last, err = appendEvents(tx, job.GetRunId(), encs); err != nil {
			return err
		}
		if lease != nil {
			held, err := s.acquireLeaseTx(tx, lease.Name, lease.Owner, lease.TTL)
			if err != nil {
				return fmt.Errorf("store: create run %s with lease %s for %s: %w", job.GetRunId(), lease.Name, lease.Owner, err)
			}
			if held {
				if epoch, err = fenceRunTx(tx, job.GetRunId()); err != nil {
					return fmt.Errorf("store: create run %s and fence it: %w", job.GetRunId(), err)
				}
			}
		}
		out, created = proto.Clone(job).(*handoffv1.Job), true
		return nil
	})
	if err != nil {
		return nil, false, 0, err
	}
	if legacy && !SameIntake(out, job) {
		return nil, false, 0, fmt.Errorf("store: request %s: %w", job.GetRequestId(), ErrRequestConflict)
	}
	if created {
		numberEvents(evs, last)
	}
	return out, created, epoch, nil
}

func decodeJob(data []byte) (*handoffv1.Job, error) {
	if data == nil {
		return nil, ErrNotFound
	}
	j := &handoffv1.Job{}
	if err := proto.Unmarshal(data, j); err != nil {
		return nil, fmt.Errorf("store: decode run: %w", err)
	}
	return j, nil
}

func (s *Bolt) GetRun(_ context.Context, runID string) (*handoffv1.Job, error) {
	var j *handoffv1.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		j, err = decodeJob(tx.Bucket(bucketRuns).Get([]byte(runID)))
		return err
	})
	return j, err
}

func (s *Bolt) PutRun(_ context.Context, job *handoffv1.Job, evs ...*handoffv1.JobEvent) error {
	return s.putRun(job, nil, evs)
}

// putRun is PutRun, and PutRunFenced with epoch set.
func (s *Bolt) putRun(job *handoffv1.Job, epoch *uint64, evs []*handoffv1.JobEvent) error {
	data, err := proto.Marshal(job)
	if err != nil {
		return err
	}
	encs, err := encodeEvents(evs)
	if err != nil {
		return fmt.Errorf("store: encode event for run %s: %w", job.GetRunId(), err)
	}
	var last uint64
	err = s.update(func(tx *bolt.Tx) error {
		if epoch != nil {
			if cur := fenceOf(tx, job.GetRunId()); cur != *epoch {
				return fmt.Errorf("store: put run %s under epoch %d (the run's is %d): %w", job.GetRunId(), *epoch, cur, ErrFenced)
			}
		}
		runs := tx.Bucket(bucketRuns)
		if runs.Get([]byte(job.GetRunId())) == nil {
			return fmt.Errorf("store: put run %s: %w", job.GetRunId(), ErrNotFound)
		}
		if err := runs.Put([]byte(job.GetRunId()), data); err != nil {
			return err
		}
		var err error
		last, err = appendEvents(tx, job.GetRunId(), encs)
		return err
	})
	if err != nil {
		return err
	}
	// Only now: a group commit may run the function again, and a failed one leaves the
	// events unwritten.
	numberEvents(evs, last)
	return nil
}

func (s *Bolt) ListRuns(_ context.Context, state handoffv1.JobState, limit int, after string) ([]*handoffv1.Job, string, error) {
	if limit <= 0 {
		limit = 100
	}
	var start uint64
	if after != "" {
		n, err := strconv.ParseUint(after, 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("store: bad page token %q", after)
		}
		start = n
	}
	var out []*handoffv1.Job
	next := ""
	err := s.db.View(func(tx *bolt.Tx) error {
		runs := tx.Bucket(bucketRuns)
		c := tx.Bucket(bucketRunIndex).Cursor()
		var k, v []byte
		if start == 0 {
			k, v = c.Last()
		} else {
			c.Seek(u64(start))
			k, v = c.Prev()
		}
		for ; k != nil; k, v = c.Prev() {
			j, err := decodeJob(runs.Get(v))
			if err != nil {
				return err
			}
			if state != handoffv1.JobState_JOB_STATE_UNSPECIFIED && j.GetState() != state {
				continue
			}
			if len(out) == limit {
				next = strconv.FormatUint(binary.BigEndian.Uint64(k)+1, 10)
				return nil
			}
			out = append(out, j)
		}
		return nil
	})
	return out, next, err
}

func (s *Bolt) AppendEvent(ctx context.Context, runID string, ev *handoffv1.JobEvent) (uint64, error) {
	enc, err := encodeEvent(ev)
	if err != nil {
		return 0, fmt.Errorf("store: encode event for run %s: %w", runID, err)
	}
	var seq uint64
	err = s.updateLinger(lingerOf(ctx), func(tx *bolt.Tx) error {
		if tx.Bucket(bucketRuns).Get([]byte(runID)) == nil {
			return fmt.Errorf("store: append event to run %s: %w", runID, ErrNotFound)
		}
		var err error
		seq, err = appendEvent(tx, runID, enc)
		return err
	})
	if err != nil {
		return 0, err
	}
	ev.Seq = seq
	return seq, nil
}

// appendEvents stores the events encoded as encs (encodeEvent) as the next events of runID's
// timeline, in order, and returns the last one's seq (their seqs are consecutive: one
// transaction holds the bucket's sequence).
func appendEvents(tx *bolt.Tx, runID string, encs [][]byte) (last uint64, err error) {
	for _, enc := range encs {
		if last, err = appendEvent(tx, runID, enc); err != nil {
			return 0, err
		}
	}
	return last, nil
}

// appendEvent stores the event encoded as enc (encodeEvent) as the next event of runID's
// timeline and returns its seq.
func appendEvent(tx *bolt.Tx, runID string, enc []byte) (uint64, error) {
	b, err := tx.Bucket(bucketEvents).CreateBucketIfNotExists([]byte(runID))
	if err != nil {
		return 0, err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return 0, err
	}
	return seq, b.Put(u64(seq), withSeq(enc, seq))
}

func (s *Bolt) Events(_ context.Context, runID string, afterSeq uint64) ([]*handoffv1.JobEvent, error) {
	var out []*handoffv1.JobEvent
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEvents).Bucket([]byte(runID))
		if b == nil {
			if tx.Bucket(bucketRuns).Get([]byte(runID)) == nil {
				return ErrNotFound
			}
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(u64(afterSeq + 1)); k != nil; k, v = c.Next() {
			ev := &handoffv1.JobEvent{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("store: decode event: %w", err)
			}
			out = append(out, ev)
		}
		return nil
	})
	return out, err
}

func decodeBudget(data []byte) (*handoffv1.Budget, error) {
	if data == nil {
		return nil, ErrNotFound
	}
	b := &handoffv1.Budget{}
	if err := proto.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("store: decode wallet: %w", err)
	}
	return b, nil
}

func (s *Bolt) OpenWallet(_ context.Context, id, job string, b *handoffv1.Budget) (*handoffv1.Budget, error) {
	if id == "" {
		return nil, fmt.Errorf("store: empty wallet id")
	}
	if job == "" {
		return nil, fmt.Errorf("store: open wallet %s: empty job id", id)
	}
	// Most calls find the wallet, already of this job (the coordinator opens it whenever it
	// loads a run): read first, so they cost no write transaction (and no fsync). Wallets
	// are never deleted.
	if cur, err := s.WalletFor(context.Background(), id, job); err == nil {
		return cur, nil
	}
	var out *handoffv1.Budget
	err := s.update(func(tx *bolt.Tx) error {
		var err error
		out, err = openWalletTx(tx, id, job, b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: open wallet %s: %w", id, err)
	}
	return out, nil
}

// openWalletTx is OpenWallet in tx: it creates wallet id of job holding b, or returns the
// one there, giving it job when it records none (ErrWrongJob when it records another).
func openWalletTx(tx *bolt.Tx, id, job string, b *handoffv1.Budget) (*handoffv1.Budget, error) {
	w := tx.Bucket(bucketWallets)
	if cur := w.Get([]byte(id)); cur != nil {
		switch owner := getIn(tx, bucketWalletJobs, id); {
		case owner == nil:
			if err := putIn(tx, bucketWalletJobs, id, job); err != nil {
				return nil, err
			}
		case string(owner) != job:
			return nil, ErrWrongJob
		}
		return decodeBudget(cur)
	}
	data, err := proto.Marshal(b)
	if err != nil {
		return nil, err
	}
	if err := w.Put([]byte(id), data); err != nil {
		return nil, err
	}
	if err := putIn(tx, bucketWalletJobs, id, job); err != nil {
		return nil, err
	}
	return proto.Clone(b).(*handoffv1.Budget), nil
}

func (s *Bolt) Debit(_ context.Context, id string, d Debit) (*handoffv1.Budget, error) {
	var out *handoffv1.Budget
	err := s.update(func(tx *bolt.Tx) error {
		out = nil
		if err := walletJobOK(tx, id, d.Job); err != nil {
			return err
		}
		w := tx.Bucket(bucketWallets)
		cur, err := decodeBudget(w.Get([]byte(id)))
		if err != nil {
			return err
		}
		if out, err = ApplyDebit(cur, d); err != nil {
			return err
		}
		data, err := proto.Marshal(out)
		if err != nil {
			return err
		}
		return w.Put([]byte(id), data)
	})
	return out, err
}

func (s *Bolt) GrantWallet(_ context.Context, id, key string, g Grant) (*handoffv1.Budget, error) {
	if key == "" {
		return nil, fmt.Errorf("store: grant to wallet %s: empty key", id)
	}
	var out *handoffv1.Budget
	err := s.update(func(tx *bolt.Tx) error {
		out = nil
		w := tx.Bucket(bucketWallets)
		cur, err := decodeBudget(w.Get([]byte(id)))
		if err != nil {
			return err
		}
		gk := []byte(id + "\x00" + key)
		if tx.Bucket(bucketGrants).Get(gk) != nil {
			out = cur
			return nil
		}
		if out, err = ApplyGrant(cur, g); err != nil {
			return err
		}
		data, err := proto.Marshal(out)
		if err != nil {
			return err
		}
		if err := w.Put([]byte(id), data); err != nil {
			return err
		}
		return tx.Bucket(bucketGrants).Put(gk, []byte{1})
	})
	return out, err
}

func (s *Bolt) Wallet(_ context.Context, id string) (*handoffv1.Budget, error) {
	var out *handoffv1.Budget
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = decodeBudget(tx.Bucket(bucketWallets).Get([]byte(id)))
		return err
	})
	return out, err
}

func (s *Bolt) WalletFor(_ context.Context, id, job string) (*handoffv1.Budget, error) {
	if job == "" {
		return nil, fmt.Errorf("store: wallet %s: empty job id", id)
	}
	var out *handoffv1.Budget
	err := s.db.View(func(tx *bolt.Tx) error {
		if err := walletJobOK(tx, id, job); err != nil {
			return err
		}
		var err error
		out, err = decodeBudget(tx.Bucket(bucketWallets).Get([]byte(id)))
		return err
	})
	return out, err
}

// idemRecord layout: state (1 byte) | expiry in unix nanoseconds, 0 = never (8 bytes) | value,
// which for a pending marker is its claim's owner token (empty in a marker written before
// claims had owners: no token matches it).
func encodeIdem(state ClaimState, expires time.Time, value []byte) []byte {
	b := make([]byte, 9+len(value))
	b[0] = byte(state)
	if !expires.IsZero() {
		binary.BigEndian.PutUint64(b[1:9], uint64(expires.UnixNano()))
	}
	copy(b[9:], value)
	return b
}

func decodeIdem(b []byte, now time.Time) (ClaimState, []byte, bool) {
	if len(b) < 9 {
		return 0, nil, false
	}
	if exp := binary.BigEndian.Uint64(b[1:9]); exp != 0 && now.UnixNano() >= int64(exp) {
		return 0, nil, false // expired: as if absent
	}
	return ClaimState(b[0]), append([]byte(nil), b[9:]...), true
}

func (s *Bolt) Unpay(_ context.Context, walletID, key string) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPaid).Delete(paidKey(walletID, key))
	})
}

// paidKey is the paid bucket's key of walletID's payment for key. Wallet ids cannot hold a
// NUL (the contract's wallet_id pattern), so the pair is unambiguous.
func paidKey(walletID, key string) []byte {
	return append(append([]byte(walletID), 0), key...)
}

// idemHeld reads key's record as a call of owner sees it: the record's state (0 when the
// key is free) and, for a pending marker, whether it is owner's claim.
func idemHeld(b *bolt.Bucket, key, owner string, now time.Time) (ClaimState, []byte, bool) {
	st, v, ok := decodeIdem(b.Get([]byte(key)), now)
	if !ok {
		return 0, nil, false
	}
	if st == Pending {
		return Pending, nil, string(v) == owner
	}
	return st, v, false
}

// Claim is Admit without a wallet.
func (s *Bolt) Claim(ctx context.Context, key string, pendingTTL time.Duration) (ClaimState, []byte, string, error) {
	a, err := s.Admit(ctx, key, pendingTTL, "", Debit{})
	if err != nil {
		return 0, nil, "", err
	}
	return a.State, a.Value, a.Owner, nil
}

// Admit is Claim and Debit in one write transaction (one fsync instead of two).
func (s *Bolt) Admit(_ context.Context, key string, pendingTTL time.Duration, walletID string, d Debit) (Admission, error) {
	if key == "" {
		return Admission{}, fmt.Errorf("store: empty idempotency key")
	}
	var a Admission
	err := s.update(func(tx *bolt.Tx) error {
		a = Admission{}
		b := tx.Bucket(bucketIdem)
		now := s.now()
		if st, v, ok := decodeIdem(b.Get([]byte(key)), now); ok {
			a.State = st
			if st == Done { // a pending marker's value is its owner's token: not shown
				a.Value = v
			}
			if st == Done && walletID != "" && d.CheckVerdict && walletJobOK(tx, walletID, d.Job) == nil && boltVerdicts(tx, walletID).resets(d.Verdict) {
				a.DebitErr = ErrSilentReset
			}
			return nil
		}
		var exp time.Time
		if pendingTTL > 0 {
			exp = now.Add(pendingTTL)
		}
		a.State, a.Owner = Claimed, newOwner()
		if err := b.Put([]byte(key), encodeIdem(Pending, exp, []byte(a.Owner))); err != nil {
			return err
		}
		if walletID == "" {
			return nil
		}
		// The job first, so a wallet of another job is refused before anything of it is
		// read out.
		if err := walletJobOK(tx, walletID, d.Job); err != nil {
			a.DebitErr = err
			return nil
		}
		w := tx.Bucket(bucketWallets)
		cur, err := decodeBudget(w.Get([]byte(walletID)))
		if errors.Is(err, ErrNotFound) {
			a.DebitErr = ErrNotFound
			return nil
		}
		if err != nil {
			return err
		}
		if d.CheckVerdict && boltVerdicts(tx, walletID).resets(d.Verdict) {
			a.DebitErr = ErrSilentReset
			return nil
		}
		paid := tx.Bucket(bucketPaid)
		pk := paidKey(walletID, key)
		if paid.Get(pk) != nil {
			a.Debited, a.Paid, a.Wallet = true, true, cur
			return nil
		}
		after, err := ApplyDebit(cur, d)
		if errors.Is(err, ErrWalletEmpty) {
			a.DebitErr, a.Wallet = ErrWalletEmpty, cur
			return nil
		}
		if err != nil {
			return err
		}
		data, err := proto.Marshal(after)
		if err != nil {
			return err
		}
		if err := paid.Put(pk, []byte{1}); err != nil {
			return err
		}
		a.Debited, a.Wallet = true, after
		return w.Put([]byte(walletID), data)
	})
	if err != nil {
		return Admission{}, err
	}
	return a, nil
}

func (s *Bolt) Complete(ctx context.Context, key, owner string, value []byte, ttl time.Duration) error {
	if err := checkOwned("complete", key, owner); err != nil {
		return err
	}
	err := s.updateLinger(lingerOf(ctx), func(tx *bolt.Tx) error {
		return s.completeTx(tx, key, owner, value, ttl)
	})
	if err != nil {
		return fmt.Errorf("store: complete %q: %w", key, err)
	}
	return nil
}

// completeTx is Complete in tx: the owner check and the record's write.
func (s *Bolt) completeTx(tx *bolt.Tx, key, owner string, value []byte, ttl time.Duration) error {
	b := tx.Bucket(bucketIdem)
	now := s.now()
	switch st, v, mine := idemHeld(b, key, owner, now); {
	case st == Done && bytes.Equal(v, value):
		return nil
	case st != 0 && !mine:
		return ErrNotOwner
	}
	var exp time.Time
	if ttl > 0 {
		exp = now.Add(ttl)
	}
	return b.Put([]byte(key), encodeIdem(Done, exp, value))
}

func (s *Bolt) Release(_ context.Context, key, owner string) error {
	if err := checkOwned("release", key, owner); err != nil {
		return err
	}
	err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIdem)
		switch st, _, mine := idemHeld(b, key, owner, s.now()); {
		case st == Pending && !mine:
			return ErrNotOwner
		case st == Pending:
			return b.Delete([]byte(key))
		}
		return nil // done (never released) or free
	})
	if err != nil {
		return fmt.Errorf("store: release %q: %w", key, err)
	}
	return nil
}

func (s *Bolt) RenewClaim(_ context.Context, key, owner string, pendingTTL time.Duration) (bool, error) {
	if key == "" || pendingTTL <= 0 {
		return false, fmt.Errorf("store: renew claim %q: the key must not be empty and the ttl must be positive (got %s)", key, pendingTTL)
	}
	if err := checkOwned("renew claim", key, owner); err != nil {
		return false, err
	}
	ok := false
	err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketIdem)
		now := s.now()
		ok = false
		switch st, _, mine := idemHeld(b, key, owner, now); {
		case st != Pending:
			return nil
		case !mine:
			return ErrNotOwner
		}
		ok = true
		return b.Put([]byte(key), encodeIdem(Pending, now.Add(pendingTTL), []byte(owner)))
	})
	if err != nil {
		return false, fmt.Errorf("store: renew claim %q: %w", key, err)
	}
	return ok, nil
}

func (s *Bolt) Lookup(_ context.Context, key string) (ClaimState, []byte, error) {
	var state ClaimState
	var value []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		state, value, _ = idemHeld(tx.Bucket(bucketIdem), key, "", s.now())
		return nil
	})
	return state, value, err
}
