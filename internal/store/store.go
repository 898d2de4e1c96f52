// Package store holds the platform's durable state: job runs and their timelines,
// idempotency records, and the demo ledger that stands in for an external system (and,
// like one, upserts by idempotency key).
//
// Every service talks to the Store interface; the embedded bbolt implementation (Open) is
// the default, so one laptop needs no server. Implementations must make Claim atomic: it
// is the single point that keeps a write from happening twice.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// ErrNotFound is returned when a run or wallet does not exist.
var ErrNotFound = errors.New("not found")

// ErrWalletEmpty is returned by Debit when the wallet cannot cover it; nothing was taken.
var ErrWalletEmpty = errors.New("wallet empty")

// ErrWrongJob is returned when a debit or read names a job (Debit.Job, WalletFor) that is
// not the one the wallet records: it records another job, or none (a wallet opened before
// wallets recorded their job, which its coordinator has not opened again since). Nothing
// was taken, and the error carries nothing of what the wallet holds.
var ErrWrongJob = errors.New("wallet is not this job's")

// ErrJobConflict is returned by CreateRun for a run whose job_id was submitted before with
// other content (JobDigest): a job's content is fixed by its first submission.
var ErrJobConflict = errors.New("job_id was submitted before with other content")

// ErrRequestConflict is returned by CreateRun for a run whose request_id was used before for
// a different request (RequestDigest): a retry repeats its request exactly.
var ErrRequestConflict = errors.New("request_id was used before for a different request")

// lingerKey carries a write's linger in its context (Linger).
type lingerKey struct{}

// Linger marks the writes made with ctx as ones off their caller's critical path, which
// need not start a transaction of their own at once: on bbolt each may wait up to d for
// another write to share its transaction (and its fsync) with, and commits alone when none
// comes; the write is as durable as any when the call returns. Honoured by the bbolt
// store's AppendEvent and Complete; Redis, where writes do not queue behind each other,
// ignores it.
func Linger(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, lingerKey{}, d)
}

func lingerOf(ctx context.Context) time.Duration {
	d, _ := ctx.Value(lingerKey{}).(time.Duration)
	return d
}

// Store is everything the services persist.
type Store interface {
	Runs
	Wallets
	Grants
	Idempotency
	Admitter
	Ledger
	Leases
	Fences
	Verdicts
	// Ping reports whether the store is reachable (health checks).
	Ping(ctx context.Context) error
	Close() error
}

// Runs stores job runs and their event timelines. A run is written after every hop, so a
// restarted coordinator resumes from the last completed hop.
type Runs interface {
	// CreateRun stores a new run, opens its wallet (as OpenWallet(job.run_id, job.job_id,
	// job.wallet) does, when job.wallet is set; a wallet needs a job_id) and appends evs to
	// its timeline, in one write: a run never exists without the wallet it started with or
	// its first events. On success each event's Seq is set. job is the run as submitted:
	// its artifacts are the job's inputs.
	//
	// In the same write it keeps job_id and request_id from being first-come:
	//   - When job.RequestId is set and a run was already created with that request id, it
	//     returns that earlier run and created=false, and writes nothing, if the request is
	//     the same (RequestDigest); a different one is ErrRequestConflict. (A request id
	//     recorded before requests recorded their digest is compared on what the earlier
	//     run still holds as submitted: SameIntake.)
	//   - A job_id whose runs were created with other content (JobDigest) is
	//     ErrJobConflict; the same content creates the new run (a repeat of the job). The
	//     first run created with a job_id fixes its content, also when older runs with that
	//     job_id exist from before runs recorded it. A run without a job_id is not checked.
	CreateRun(ctx context.Context, job *handoffv1.Job, evs ...*handoffv1.JobEvent) (run *handoffv1.Job, created bool, err error)
	// GetRun returns a run or ErrNotFound.
	GetRun(ctx context.Context, runID string) (*handoffv1.Job, error)
	// PutRun replaces a stored run (ErrNotFound if it was never created) and appends evs
	// to its timeline (as AppendEvent does, in order), atomically: the run's state and the
	// events that led to it are saved together, in one write. On success each event's Seq
	// is set to its place in the timeline.
	PutRun(ctx context.Context, job *handoffv1.Job, evs ...*handoffv1.JobEvent) error
	// ListRuns lists runs newest first, optionally only those in one state. after is the
	// page token returned by the previous call ("" for the first page).
	ListRuns(ctx context.Context, state handoffv1.JobState, limit int, after string) (runs []*handoffv1.Job, next string, err error)
	// AppendEvent adds an event to a run's timeline, assigning the next sequence number
	// (from 1), and returns it; on success ev.Seq is set to it too.
	AppendEvent(ctx context.Context, runID string, ev *handoffv1.JobEvent) (uint64, error)
	// Events returns a run's events with seq > afterSeq, in order.
	Events(ctx context.Context, runID string, afterSeq uint64) ([]*handoffv1.JobEvent, error)
}

// Debit is what one step takes from a wallet.
type Debit struct {
	// Hops and Revisions are taken whole or not at all: when the wallet holds fewer,
	// Debit returns ErrWalletEmpty and takes nothing.
	Hops, Revisions uint32
	// USDMicros is money actually spent (reported after the work), so it is clamped: the
	// wallet ends at zero, never below.
	USDMicros int64
	// RequireMoney makes Debit fail with ErrWalletEmpty when no money is left before it.
	RequireMoney bool
	// Job, when set, is the job paying: the wallet must record it, or the debit fails with
	// ErrWrongJob and takes nothing. It is checked before anything else about the wallet,
	// so a refusal says nothing of what another job's wallet holds. Empty: not checked
	// (the rail's own debits of its run's wallet).
	Job string
	// CheckVerdict makes Admit refuse a silent reset (ErrSilentReset): Verdict is the
	// evaluator.last_verdict the package claims (unspecified when it has no evaluator),
	// checked against the wallet's recorded verdicts (RecordVerdict) after the job and
	// before anything is taken. Debit ignores both.
	CheckVerdict bool
	Verdict      handoffv1.Verdict
}

// Wallets hold each job's one budget. Debit is atomic, so concurrent hops on one wallet
// can neither overspend it nor drive it below zero. A wallet records the job it belongs to,
// so a package of one job cannot pay from another's (Debit.Job, WalletFor).
type Wallets interface {
	// OpenWallet creates wallet id of job job (not empty) holding b. If it already exists
	// it is left unchanged and returned, so opening is safe to retry; one that records no
	// job (opened before wallets recorded it) is given job, which is how wallets of an
	// older store are adopted by their runs' coordinator; one of another job is
	// ErrWrongJob.
	OpenWallet(ctx context.Context, id, job string, b *handoffv1.Budget) (*handoffv1.Budget, error)
	// Debit takes d from wallet id and returns what is left (ErrNotFound, ErrWrongJob,
	// ErrWalletEmpty).
	Debit(ctx context.Context, id string, d Debit) (*handoffv1.Budget, error)
	// Wallet returns what wallet id holds, whatever its job.
	Wallet(ctx context.Context, id string) (*handoffv1.Budget, error)
	// WalletFor returns what wallet id holds when it is job's, in one read: ErrWrongJob
	// when it records another job or none, ErrNotFound when there is no such wallet.
	WalletFor(ctx context.Context, id, job string) (*handoffv1.Budget, error)
}

// Grant is what a person gives a run's wallet when returning it to a stage: the one way a
// wallet grows.
type Grant struct {
	Hops, Revisions uint32
	USDMicros       int64
}

// Zero reports whether g gives nothing.
func (g Grant) Zero() bool { return g.Hops == 0 && g.Revisions == 0 && g.USDMicros == 0 }

// ErrGrantTooLarge: a grant would take the wallet past what a budget may hold.
var ErrGrantTooLarge = errors.New("store: the grant takes the wallet past what a budget may hold")

// MaxHops and MaxRevisions are the most a budget holds (the contract's caps).
const (
	MaxHops      = 1000
	MaxRevisions = 100
)

// Grants grows wallets, on a person's decision only.
type Grants interface {
	// GrantWallet adds g to wallet id once per key (the decision's name): a key already
	// granted adds nothing and returns what the wallet holds, so a retried decision
	// never grants twice. ErrNotFound, ErrGrantTooLarge.
	GrantWallet(ctx context.Context, id, key string, g Grant) (*handoffv1.Budget, error)
}

// ApplyGrant is the one definition of a grant: b with g added, or ErrGrantTooLarge.
func ApplyGrant(b *handoffv1.Budget, g Grant) (*handoffv1.Budget, error) {
	if g.USDMicros < 0 {
		return nil, errors.New("store: a grant cannot take money")
	}
	if uint64(b.GetHopsRemaining())+uint64(g.Hops) > MaxHops || uint64(b.GetRevisionsRemaining())+uint64(g.Revisions) > MaxRevisions ||
		b.GetUsdRemainingMicros() > math.MaxInt64-g.USDMicros {
		return nil, ErrGrantTooLarge
	}
	return &handoffv1.Budget{
		UsdRemainingMicros: b.GetUsdRemainingMicros() + g.USDMicros,
		RevisionsRemaining: b.GetRevisionsRemaining() + g.Revisions,
		HopsRemaining:      b.GetHopsRemaining() + g.Hops,
	}, nil
}

// ApplyDebit is the one definition of a debit, shared by the implementations: it returns
// the budget after d, or ErrWalletEmpty when d cannot be covered.
func ApplyDebit(b *handoffv1.Budget, d Debit) (*handoffv1.Budget, error) {
	if b.GetHopsRemaining() < d.Hops || b.GetRevisionsRemaining() < d.Revisions || (d.RequireMoney && b.GetUsdRemainingMicros() <= 0) {
		return nil, ErrWalletEmpty
	}
	if d.USDMicros < 0 {
		return nil, errors.New("store: a debit cannot add money")
	}
	left := int64(0)
	if b.GetUsdRemainingMicros() > d.USDMicros { // compare, not subtract: no overflow
		left = b.GetUsdRemainingMicros() - d.USDMicros
	}
	return &handoffv1.Budget{
		UsdRemainingMicros: left,
		RevisionsRemaining: b.GetRevisionsRemaining() - d.Revisions,
		HopsRemaining:      b.GetHopsRemaining() - d.Hops,
	}, nil
}

// ClaimState is the outcome of an idempotency claim.
type ClaimState int

const (
	// Claimed: the caller now owns the key and must do the work, then Complete or Release.
	Claimed ClaimState = iota + 1
	// Pending: another caller owns the key and has not finished; retry later.
	Pending
	// Done: the work was done; the record's value is the first result.
	Done
)

func (s ClaimState) String() string {
	switch s {
	case Claimed:
		return "claimed"
	case Pending:
		return "pending"
	case Done:
		return "done"
	}
	return "unknown"
}

// ErrNotOwner is returned by Complete, Release, RenewClaim and AppendLedgerComplete when the
// key's claim is not the caller's: its own claim lapsed and another caller claimed the key
// (the record is pending under another owner token), or the key was completed with another
// result. Nothing was written: a stale holder never settles or extends another's claim.
var ErrNotOwner = errors.New("the idempotency key is claimed by another caller (this caller's claim lapsed)")

// Idempotency records make a repeated request return the first result. The protocol is
// claim first (a pending marker), do the work, then store the result under the key.
//
// Each claim has an owner token, made by the store when it claims the key and kept in the
// pending marker: Complete, Release and RenewClaim name it and check it in the same
// transaction or script as their write, so a holder whose claim lapsed while another
// caller claimed the key cannot renew, release or complete that other caller's claim.
type Idempotency interface {
	// Claim atomically takes key if it is free (or its pending marker expired after
	// pendingTTL) and returns the claim's owner token. Otherwise it reports Pending, or
	// Done with the stored value, and no token.
	Claim(ctx context.Context, key string, pendingTTL time.Duration) (state ClaimState, value []byte, owner string, err error)
	// Complete stores the result under a key that owner claimed. ttl <= 0 keeps it forever.
	// It is ErrNotOwner, writing nothing, while the key is pending under another owner or
	// done with another value; a key owner's claim left free (it lapsed and nobody claimed
	// it since) is completed, since the result is still the key's first; a key already done
	// with value is left as it is (a retried Complete whose first attempt landed).
	Complete(ctx context.Context, key, owner string, value []byte, ttl time.Duration) error
	// Release drops owner's pending claim after the work failed, so a retry can claim it
	// again. A completed record is never released; a key pending under another owner is
	// ErrNotOwner (left as it is); a free key is no error.
	Release(ctx context.Context, key, owner string) error
	// Lookup reads a key without claiming it; state 0 means no record.
	Lookup(ctx context.Context, key string) (ClaimState, []byte, error)
	// RenewClaim gives owner's pending claim a new pendingTTL from now, so a holder still
	// at work keeps a short claim, one that lapses soon after its holder died. It reports
	// false, changing nothing, when key is not pending (done, released or lapsed), and
	// false with ErrNotOwner when it is pending under another owner.
	RenewClaim(ctx context.Context, key, owner string, pendingTTL time.Duration) (bool, error)
}

// newOwner makes a claim's owner token: 96 random bits, unique among the claims of a key.
func newOwner() string {
	var b [12]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// checkOwned checks the key and owner of Complete, Release and RenewClaim.
func checkOwned(op, key, owner string) error {
	switch {
	case key == "":
		return fmt.Errorf("store: %s: empty idempotency key", op)
	case owner == "":
		return fmt.Errorf("store: %s %q: empty owner token (the one Claim or Admit returned)", op, key)
	}
	return nil
}

// Admission is what Admit found and did.
type Admission struct {
	// State is the key's claim state, as Claim reports it.
	State ClaimState
	// Owner is the claim's owner token when State is Claimed (see Idempotency), else "".
	Owner string
	// Value is the stored result when State is Done.
	Value []byte
	// Debited is true when the wallet was debited: Wallet is then what is left.
	Debited bool
	// Paid is true when this key had already been debited from this wallet by an earlier
	// Admit whose claim was then released or lapsed (a retry after a crash or a timeout):
	// nothing is taken again, Debited is true and Wallet is what the wallet holds.
	Paid bool
	// DebitErr says why a claimed key's wallet was not debited: ErrWalletEmpty (Wallet is
	// then what the wallet holds, unchanged), ErrNotFound (no such wallet; Wallet nil) or
	// ErrWrongJob (the wallet is not d.Job's; Wallet nil: nothing of it is shown), or
	// ErrSilentReset (d.CheckVerdict: the package resets a failed verdict; Wallet nil,
	// nothing taken). ErrSilentReset is also reported for a key that is Done (the check
	// is made whatever the claim finds, so a reset package is not answered with the
	// stored result of an earlier round); otherwise always nil when nothing was claimed
	// or no wallet was named.
	DebitErr error
	Wallet   *handoffv1.Budget
}

// Admitter admits one hop in one store round trip: the agent runner's idempotency claim and
// the job's wallet debit, which would otherwise be two (a transaction each on bbolt, a
// network round trip each on Redis).
type Admitter interface {
	// Admit claims key as Claim does and, only when it is Claimed and walletID is not
	// empty, debits d from wallet walletID as Debit does (d.Job checked first), atomically
	// with the claim. A refused debit (empty, missing or another job's wallet) leaves the
	// claim in place: the caller
	// Releases it as after any other refusal. A key that is Pending or Done debits nothing,
	// and a wallet is debited at most once per key (see Admission.Paid), so neither a
	// re-delivery nor a retry after a released or lapsed claim is charged twice.
	Admit(ctx context.Context, key string, pendingTTL time.Duration, walletID string, d Debit) (Admission, error)
	// Unpay forgets that walletID paid for key, so the next Admit of key debits again: for
	// a hop whose work ran and failed, where a new attempt is a new hop. Unknown wallets and
	// keys are no error.
	Unpay(ctx context.Context, walletID, key string) error
}

// LedgerEntry is one write to the demo ledger.
type LedgerEntry struct {
	ID      string
	Key     string
	Payload []byte
	At      time.Time
	// Offers is how many AppendLedger or AppendLedgerComplete calls named Key, the one
	// that made the entry included. Above 1, the platform sent the write again and the
	// ledger absorbed it by its key: what would have been a double write. Not part of the
	// entry as stored (json:"-"); the store counts it beside the entry.
	Offers int `json:"-"`
}

// Ledger is the demo's external system, and like a real downstream it enforces the
// idempotency key itself: it upserts by key. The first write of a key makes its entry;
// every later one returns that entry, writes no other and does not change it (its payload
// is neither kept nor compared: the first write wins), and is only counted
// (LedgerEntry.Offers), so tests still see each write the platform let through twice.
type Ledger interface {
	// AppendLedger makes key's entry with payload unless key has one, and returns key's
	// entry; created says whether this call made it.
	AppendLedger(ctx context.Context, key string, payload []byte) (e LedgerEntry, created bool, err error)
	// AppendLedgerComplete is AppendLedger and Idempotency.Complete in one transaction,
	// for a writer whose idempotency records live in this store: it upserts payload under
	// key as AppendLedger does and stores result(entry) under idemKey as Complete(idemKey,
	// result(entry), ttl) does, whichever call made the entry. So the entry and the result
	// built from it (the writeback's receipt naming the entry id) exist together or not at
	// all, whenever the writer dies. result may run more than once (each run must only
	// compute); an error from it aborts the transaction and is returned.
	// owner is the token of the caller's claim of idemKey: a claim that is not the caller's
	// is ErrNotOwner, as for Complete, and then (except on Redis Cluster, where the ledger
	// and the record are in different slots and the upsert comes first) the entry is not
	// made either.
	AppendLedgerComplete(ctx context.Context, key string, payload []byte, idemKey, owner string, ttl time.Duration, result func(LedgerEntry) ([]byte, error)) (e LedgerEntry, created bool, err error)
	// LedgerEntries returns every entry, oldest first, each with its Offers.
	LedgerEntries(ctx context.Context) ([]LedgerEntry, error)
}

// encodeEvent is ev's encoding without its seq: what Redis's events list stores (the position
// is the seq; Events puts it back), and what bbolt stores after withSeq. The caller's event
// is read, never written: it is copied only in the rare case it carries a seq already.
func encodeEvent(ev *handoffv1.JobEvent) ([]byte, error) {
	if ev.GetSeq() != 0 {
		ev = proto.Clone(ev).(*handoffv1.JobEvent)
		ev.Seq = 0
	}
	return proto.Marshal(ev)
}

// encodeEvents is encodeEvent of each of evs.
func encodeEvents(evs []*handoffv1.JobEvent) ([][]byte, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	out := make([][]byte, len(evs))
	for i, ev := range evs {
		b, err := encodeEvent(ev)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// seqField is JobEvent.seq's field number.
var seqField = (&handoffv1.JobEvent{}).ProtoReflect().Descriptor().Fields().ByName("seq").Number()

// withSeq is the encoding of the event encoded as enc (encodeEvent: no seq) with seq set:
// the seq field put before the rest, where proto.Marshal puts field 1, so the event is
// encoded once however often the transaction holding it runs, and never copied.
func withSeq(enc []byte, seq uint64) []byte {
	b := make([]byte, 0, protowire.SizeTag(seqField)+protowire.SizeVarint(seq)+len(enc))
	b = protowire.AppendTag(b, seqField, protowire.VarintType)
	b = protowire.AppendVarint(b, seq)
	return append(b, enc...)
}

// numberEvents sets the Seq of evs, the events just appended in order to a timeline whose
// last event now has seq last.
func numberEvents(evs []*handoffv1.JobEvent, last uint64) {
	for i, ev := range evs {
		ev.Seq = last - uint64(len(evs)-1-i)
	}
}
