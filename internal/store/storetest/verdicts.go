package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
)

// testVerdicts: after a FAIL is recorded for a wallet, Admit with a verdict check refuses a
// package that claims no verdict, or a PASS no judge gave (ErrSilentReset), taking
// nothing, for a fresh key and for a done one; it admits one that carries the FAIL, and a
// PASS once a PASS is recorded. Before any FAIL nothing is refused; another job's wallet
// says nothing of its verdicts.
func testVerdicts(t *testing.T, s store.Store) {
	ctx := context.Background()
	const (
		none = handoffv1.Verdict_VERDICT_UNSPECIFIED
		pass = handoffv1.Verdict_VERDICT_PASS
		fail = handoffv1.Verdict_VERDICT_FAIL
	)
	if _, err := s.OpenWallet(ctx, "wv", "job-v", &handoffv1.Budget{UsdRemainingMicros: 1000, HopsRemaining: 50}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordVerdict(ctx, "no-such-wallet", fail); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RecordVerdict of a missing wallet = %v, want ErrNotFound", err)
	}
	n := 0
	admit := func(claimed handoffv1.Verdict, job string) store.Admission {
		t.Helper()
		n++
		d := store.Debit{Hops: 1, RequireMoney: true, Job: job, CheckVerdict: true, Verdict: claimed}
		a, err := s.Admit(ctx, "kv"+string(rune('a'+n)), time.Minute, "wv", d)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	hops := func() uint32 {
		w, err := s.Wallet(ctx, "wv")
		if err != nil {
			t.Fatal(err)
		}
		return w.GetHopsRemaining()
	}
	// Before any verdict, and after a PASS alone, nothing is a reset.
	for _, v := range []handoffv1.Verdict{none, pass} {
		if a := admit(v, "job-v"); a.DebitErr != nil || !a.Debited {
			t.Fatalf("before any FAIL, claiming %s: %+v; want admitted", v, a)
		}
	}
	if err := s.RecordVerdict(ctx, "wv", fail); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		claimed handoffv1.Verdict
		reset   bool
	}{{none, true}, {pass, true}, {fail, false}} {
		before := hops()
		a := admit(tc.claimed, "job-v")
		if tc.reset != errors.Is(a.DebitErr, store.ErrSilentReset) || a.State != store.Claimed {
			t.Fatalf("after a FAIL, claiming %s: %+v; want reset %v", tc.claimed, a, tc.reset)
		}
		if tc.reset && (a.Debited || hops() != before) {
			t.Fatalf("a refused reset took a hop: %+v, %d -> %d", a, before, hops())
		}
	}
	// A done key is checked too: a reset package is not answered with the stored result
	// without a word.
	d := store.Debit{Hops: 1, RequireMoney: true, Job: "job-v", CheckVerdict: true}
	claimed, err := s.Admit(ctx, "kv-done", time.Minute, "", store.Debit{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "kv-done", claimed.Owner, []byte("first"), 0); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Admit(ctx, "kv-done", time.Minute, "wv", d); err != nil || a.State != store.Done || !errors.Is(a.DebitErr, store.ErrSilentReset) {
		t.Fatalf("a reset package on a done key: %+v, %v; want Done with ErrSilentReset", a, err)
	}
	d.Verdict = fail
	if a, err := s.Admit(ctx, "kv-done", time.Minute, "wv", d); err != nil || a.State != store.Done || a.DebitErr != nil {
		t.Fatalf("a carried FAIL on a done key: %+v, %v; want Done, no error", a, err)
	}
	// The same rule read alone (Check): a reset for this job, nothing for another job's
	// wallet or a missing one.
	for _, tc := range []struct {
		id, job string
		claimed handoffv1.Verdict
		want    bool
	}{{"wv", "job-v", none, true}, {"wv", "job-v", fail, false}, {"wv", "job-other", none, false}, {"no-such-wallet", "job-v", none, false}} {
		if got, err := s.ResetsVerdict(ctx, tc.id, tc.job, tc.claimed); err != nil || got != tc.want {
			t.Fatalf("ResetsVerdict(%s, %s, %s) = %v, %v; want %v", tc.id, tc.job, tc.claimed, got, err, tc.want)
		}
	}
	// Another job's wallet: refused as another job's, never as a reset.
	if a := admit(none, "job-other"); !errors.Is(a.DebitErr, store.ErrWrongJob) {
		t.Fatalf("another job claiming none: %+v; want ErrWrongJob", a)
	}
	// Without the check (Claim, the rail's own debits) nothing is refused.
	if a, err := s.Admit(ctx, "kv-nocheck", time.Minute, "wv", store.Debit{Hops: 1, Job: "job-v"}); err != nil || a.DebitErr != nil {
		t.Fatalf("Admit without a verdict check: %+v, %v", a, err)
	}
	// Once a judge passes, a PASS is one given.
	if err := s.RecordVerdict(ctx, "wv", pass); err != nil {
		t.Fatal(err)
	}
	if a := admit(pass, "job-v"); a.DebitErr != nil {
		t.Fatalf("claiming the PASS a judge gave: %+v", a)
	}
	if a := admit(none, "job-v"); !errors.Is(a.DebitErr, store.ErrSilentReset) {
		t.Fatalf("after FAIL then PASS, claiming none: %+v; want still a reset", a)
	}
}
