package coordinator_test

import (
	"context"
	"errors"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// renewBlip is a store whose AcquireLease fails while armed (the store unreachable for
// lease calls only): the first failed call closes failed. Unless sticky, a failed call from
// a driver's renewal before a hop (lease.renew) disarms it, so the blip lasts exactly until
// the driver met it.
type renewBlip struct {
	store.Store
	armed        atomic.Bool
	sticky       bool
	failed       chan struct{}
	once         sync.Once
	renewRefused atomic.Int32
}

func (b *renewBlip) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if b.armed.Load() {
		b.once.Do(func() { close(b.failed) })
		if strings.Contains(string(debug.Stack()), "(*lease).renew") {
			b.renewRefused.Add(1)
			if !b.sticky {
				b.armed.Store(false)
			}
		}
		return false, errors.New("renewBlip: store unreachable for a moment")
	}
	return b.Store.AcquireLease(ctx, name, owner, ttl)
}

// carriedAtRenewal starts a replica on a renewBlip over r's store, submits a job, and arms
// the blip while the draft is in flight, once the background renewal has failed (so the
// driver's own renewal before the judge hop is due). It returns the run id and the blip;
// the draft is still held by r's gate.
func carriedAtRenewal(t *testing.T, r *replicas, sticky bool) (string, *renewBlip) {
	t.Helper()
	r.draft.questions = []string{"which plan is the account on"}
	r.opts.LeaseTTL = 6 * time.Second // background renewal every 2s; lost after 3s without one: 1s for the draft to answer
	blip := &renewBlip{Store: r.st.Store, failed: make(chan struct{}), sticky: sticky}
	a := r.replica(t, "replica-a", blip)
	id := r.submit(t, a, "tkt_blip")
	for r.g.waits.Load() < 1 { // the draft is in flight
		time.Sleep(5 * time.Millisecond)
	}
	blip.armed.Store(true)
	select {
	case <-blip.failed:
	case <-time.After(5 * time.Second):
		t.Fatal("no lease renewal came while the draft was in flight")
	}
	return id, blip
}

// draftOnce checks that the draft's hop, made once, is in the run's timeline once with its
// ACCEPTED ack, and its open question and spend in the run.
func draftOnce(t *testing.T, r *replicas, job *handoffv1.Job) {
	t.Helper()
	evs, err := r.st.Store.Events(context.Background(), job.GetRunId(), 0)
	if err != nil {
		t.Fatal(err)
	}
	tl := kinds(evs)
	if n := count(tl, "draft:PACKAGE_SENT"); n != 1 || !slices.Contains(tl, "draft:ACK:ACCEPTED") || slices.Contains(tl, "draft:ACK:DUPLICATE") {
		t.Errorf("timeline %v: want the draft's package once and its ACCEPTED ack (the hop made once and kept)", tl)
	}
	if !slices.Contains(job.GetOpenQuestions(), "which plan is the account on") {
		t.Errorf("run's open questions %q: the draft's question was lost", job.GetOpenQuestions())
	}
	if r.draft.calls() != 1 {
		t.Errorf("draft ran %d times; want 1", r.draft.calls())
	}
}

// TestRenewFailureKeepsCarriedMove: the draft's move is carried to the judge's package, and
// the driver's renewal before that hop fails once (a blip well inside the lease). The
// renewal is tried again with the run as it is in memory: the draft's outcome is saved
// with the judge's package, not dropped and the draft re-sent (which the runner would
// answer DUPLICATE, without the result's questions and spend).
func TestRenewFailureKeepsCarriedMove(t *testing.T) {
	r := startReplicas(t)
	id, blip := carriedAtRenewal(t, r, false)
	r.g.release()
	job := r.waitTerminal(t, []string{id}, 15*time.Second)[0]
	if blip.renewRefused.Load() != 1 {
		t.Fatalf("the driver's renewal was refused %d times; want 1 (the blip met before the judge hop)", blip.renewRefused.Load())
	}
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED || job.GetSpentUsdMicros() != 150 {
		t.Fatalf("run ended %s having spent %d µUSD; want COMPLETED, 150 (draft 100 + judge 50)", job.GetState(), job.GetSpentUsdMicros())
	}
	draftOnce(t, r, job)
}

// TestLostDriverSavesCarriedMove: the renewals keep failing until the driver's lease is
// given up (its context cancelled, LeaseTTL/2 without a renewal) while the draft's move is
// carried. On its way out the driver saves it (fenced by its epoch, which no one has taken
// yet), so the run is at the judge, and the replica that takes the run over later starts
// there instead of sending the draft again.
func TestLostDriverSavesCarriedMove(t *testing.T) {
	r := startReplicas(t)
	id, blip := carriedAtRenewal(t, r, true)
	r.g.release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		j, err := r.st.Store.GetRun(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if j.GetStage() == "judge" && j.GetHops() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run still at %s after %d hops while its driver cannot renew; want the draft's move saved (at judge after 1)", j.GetStage(), j.GetHops())
		}
		time.Sleep(20 * time.Millisecond)
	}
	blip.armed.Store(false) // the store answers again: the run is taken over where it stands
	job := r.waitTerminal(t, []string{id}, 15*time.Second)[0]
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("run ended %s: %v", job.GetState(), job.GetEscalation())
	}
	draftOnce(t, r, job)
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}
