package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
)

func TestConcurrentWritesBolt(t *testing.T) { testConcurrentWrites(t, openBolt(t)) }

func TestConcurrentWritesRedis(t *testing.T) { testConcurrentWrites(t, openRedis(t)) }

// testConcurrentWrites: 200 callers send the same write at once and retry on Aborted as its
// RetryInfo says. The external sink sees one write; every caller gets its receipt; all but
// the writer's answer are marked duplicate by the replay hook.
func testConcurrentWrites(t *testing.T, st store.Idempotency) {
	const n = 200
	f := &fakeWriteback{delay: 100 * time.Millisecond}
	c := writebackClient(t, st, f, idempotency.WithRetryDelay(25*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		answers = make([]*handoffv1.WriteResponse, n)
		errs    = make([]error, n)
		aborts  = make([]int, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i], aborts[i], errs[i] = retrying(ctx, func() (*handoffv1.WriteResponse, error) {
				return c.Write(ctx, writeReq("job-200"))
			})
		}()
	}
	close(start)
	wg.Wait()

	if got := f.sink.count(); got != 1 {
		t.Fatalf("sink has %d writes; want exactly 1", got)
	}
	if got := f.calls.Load(); got != 1 {
		t.Errorf("handler ran %d times; want 1", got)
	}
	var first *handoffv1.Receipt
	dups, totalAborts := 0, 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		rc := answers[i].GetReceipt()
		if first == nil {
			first = rc
		}
		if !testkit.Equal(t, rc, first, fmt.Sprintf("caller %d's receipt", i)) {
			t.FailNow()
		}
		if answers[i].GetDuplicate() {
			dups++
		}
		totalAborts += aborts[i]
	}
	if first.GetExternalId() != "ext-001" {
		t.Errorf("receipt %v; want the sink's first write", first)
	}
	if dups != n-1 {
		t.Errorf("%d answers marked duplicate; want %d", dups, n-1)
	}
	if totalAborts == 0 {
		t.Error("no caller was ever told the write was in flight; the test did not race")
	}
	t.Logf("%d callers, 1 write, %d duplicates, %d Aborted answers retried", n, dups, totalAborts)
}

// TestHandlerErrorReleases: a failed write frees the key; the retry writes once, and the
// next call gets that write's receipt.
func TestHandlerErrorReleases(t *testing.T) {
	st := openBolt(t)
	f := &fakeWriteback{}
	f.failFirst.Store(1)
	c := writebackClient(t, st, f)
	ctx := context.Background()

	_, err := c.Write(ctx, writeReq("job-err"))
	wantCode(t, err, codes.Unavailable, "target ledger: connection refused")
	if state, _ := lookup(t, st, "job-err:writeback:summary_md"); state != 0 {
		t.Fatalf("after the failed write the key is %v; want released", state)
	}
	second, err := c.Write(ctx, writeReq("job-err"))
	if err != nil || second.GetDuplicate() {
		t.Fatalf("retry = %v, %v; want a fresh write", second, err)
	}
	third, err := c.Write(ctx, writeReq("job-err"))
	if err != nil || !third.GetDuplicate() || !proto.Equal(third.GetReceipt(), second.GetReceipt()) {
		t.Fatalf("repeat = %v, %v; want the retry's receipt, duplicate", third, err)
	}
	if f.sink.count() != 1 || f.calls.Load() != 2 {
		t.Errorf("%d writes, %d handler calls; want 1 and 2", f.sink.count(), f.calls.Load())
	}
}

// TestCallerCancelsMidWrite: the caller hangs up while the write runs. The write (whose
// handler honours its context) still completes and is recorded; a retry in the meantime is
// told it is in flight, and the retry after gets the stored receipt.
func TestCallerCancelsMidWrite(t *testing.T) {
	st := openBolt(t)
	f := &fakeWriteback{started: make(chan struct{}, 1), proceed: make(chan struct{})}
	c := writebackClient(t, st, f, idempotency.WithRetryDelay(10*time.Millisecond))
	const key = "job-cancel:writeback:summary_md"

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(ctx, writeReq("job-cancel"))
		done <- err
	}()
	<-f.started
	cancel()
	wantCode(t, <-done, codes.Canceled, "")

	_, err := c.Write(context.Background(), writeReq("job-cancel"))
	wantCode(t, err, codes.Aborted, "request with idempotency key "+key+" is in flight")

	close(f.proceed)
	waitDone(t, st, key)
	resp, _, err := retrying(context.Background(), func() (*handoffv1.WriteResponse, error) {
		return c.Write(context.Background(), writeReq("job-cancel"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetDuplicate() || resp.GetReceipt().GetExternalId() != "ext-001" {
		t.Errorf("retry = %v; want the abandoned call's receipt, duplicate", resp)
	}
	if f.sink.count() != 1 || f.calls.Load() != 1 {
		t.Errorf("%d writes, %d handler calls; want 1 and 1", f.sink.count(), f.calls.Load())
	}
}

// TestCompleteFailure: the write happened but its receipt cannot be stored. The caller gets
// Internal, and the claim is left in place, so a retry within the pending TTL is refused
// (Aborted) instead of writing again.
func TestCompleteFailure(t *testing.T) {
	fs := &faultStore{Idempotency: openBolt(t), completeErr: errors.New("disk full")}
	f := &fakeWriteback{}
	c := writebackClient(t, fs, f, idempotency.WithPendingTTL(time.Minute))
	ctx := context.Background()

	_, err := c.Write(ctx, writeReq("job-cf"))
	wantCode(t, err, codes.Unavailable, "was done but its result could not be stored: disk full")
	for range 3 {
		_, err = c.Write(ctx, writeReq("job-cf"))
		wantCode(t, err, codes.Aborted, "is in flight")
	}
	if f.sink.count() != 1 || f.calls.Load() != 1 {
		t.Errorf("%d writes, %d handler calls; want 1 and 1", f.sink.count(), f.calls.Load())
	}
	if fs.completes.Load() != 3 || fs.releases.Load() != 0 {
		t.Errorf("%d completes, %d releases; want 3 attempts, no release", fs.completes.Load(), fs.releases.Load())
	}
}

// TestStoreDownOnClaim: no write without its idempotency record.
func TestStoreDownOnClaim(t *testing.T) {
	fs := &faultStore{Idempotency: openBolt(t), claimErr: errors.New("connection refused")}
	f := &fakeWriteback{}
	c := writebackClient(t, fs, f)
	_, err := c.Write(context.Background(), writeReq("job-down"))
	wantCode(t, err, codes.Unavailable, "idempotency store: claim job-down:writeback:summary_md: connection refused")
	if f.calls.Load() != 0 || f.sink.count() != 0 {
		t.Errorf("%d handler calls, %d writes; want none", f.calls.Load(), f.sink.count())
	}
}

// TestResultTTLExpiry documents WithResultTTL: a repeat after the result expired is a new
// request and writes again.
//
// The result is stored during the first Write and looked up during the repeat, so a repeat
// that returns within ttl of the first Write's start was looked up within the TTL and must
// be a duplicate. One that took longer (a run slowed past the window) shows nothing either
// way and is tried again on a fresh key.
func TestResultTTLExpiry(t *testing.T) {
	const ttl = 50 * time.Millisecond
	st := openBolt(t)
	f := &fakeWriteback{}
	c := writebackClient(t, st, f, idempotency.WithResultTTL(ttl))
	ctx := context.Background()
	var job string
	var writes int // the sink's writes before job's first
	for attempt := 1; ; attempt++ {
		job, writes = fmt.Sprintf("job-ttl-%d", attempt), f.sink.count()
		start := time.Now()
		if _, err := c.Write(ctx, writeReq(job)); err != nil {
			t.Fatal(err)
		}
		r, err := c.Write(ctx, writeReq(job))
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(start) < ttl {
			if !r.GetDuplicate() {
				t.Fatalf("repeat within the TTL = %v; want duplicate", r)
			}
			break
		}
		if attempt == 20 {
			t.Fatalf("no write and repeat within the %s TTL in %d attempts", ttl, attempt)
		}
	}
	time.Sleep(2 * ttl)
	if r, err := c.Write(ctx, writeReq(job)); err != nil || r.GetDuplicate() {
		t.Fatalf("repeat after the TTL = %v, %v; want a fresh write", r, err)
	}
	if n := f.sink.count() - writes; n != 2 {
		t.Errorf("%d writes; want 2 (the result had expired)", n)
	}
}

// TestHandlerStoresItsResult: a handler whose effect lives in the idempotency store finds
// its claim (key and result TTL) in its context, stores the result itself (with the effect,
// in one transaction, in the writeback) and says so: the interceptor does not store it
// again, and repeats are answered with what the handler stored.
func TestHandlerStoresItsResult(t *testing.T) {
	bolt := openBolt(t)
	fs := &faultStore{Idempotency: bolt}
	f := &fakeWriteback{selfStore: bolt, claims: make(chan *idempotency.Claim, 1)}
	c := writebackClient(t, fs, f, idempotency.WithResultTTL(time.Hour))
	ctx := context.Background()
	first, err := c.Write(ctx, writeReq("job-self"))
	if err != nil || first.GetDuplicate() {
		t.Fatalf("Write = %v, %v; want a fresh write", first, err)
	}
	if cl := <-f.claims; cl == nil || cl.Key != "job-self:writeback:summary_md" || cl.ResultTTL != time.Hour {
		t.Fatalf("claim in the handler's context = %+v; want key job-self:writeback:summary_md, result TTL 1h", cl)
	}
	if n := fs.completes.Load(); n != 0 {
		t.Errorf("the interceptor stored the result %d times after the handler had; want 0", n)
	}
	again, err := c.Write(ctx, writeReq("job-self"))
	if err != nil || !again.GetDuplicate() || !proto.Equal(again.GetReceipt(), first.GetReceipt()) {
		t.Fatalf("repeat = %v, %v; want the handler's stored receipt, duplicate", again, err)
	}
	if f.calls.Load() != 1 || f.sink.count() != 1 {
		t.Errorf("%d handler calls, %d writes; want 1 and 1", f.calls.Load(), f.sink.count())
	}

	// A handler that stores nothing itself has its result stored by the interceptor.
	f2 := &fakeWriteback{claims: make(chan *idempotency.Claim, 1)}
	fs2 := &faultStore{Idempotency: openBolt(t)}
	if _, err := writebackClient(t, fs2, f2).Write(ctx, writeReq("job-plain")); err != nil {
		t.Fatal(err)
	}
	if cl := <-f2.claims; cl == nil || cl.ResultTTL != 0 {
		t.Fatalf("claim = %+v; want one with the default result TTL 0 (forever)", cl)
	}
	if n := fs2.completes.Load(); n != 1 {
		t.Errorf("the interceptor stored the result %d times; want 1", n)
	}
}
