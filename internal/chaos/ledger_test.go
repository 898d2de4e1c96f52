package chaos

import (
	"os"
	"slices"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/store"
)

// TestWritebackKillPlan: where the writeback's kills go for each target.
func TestWritebackKillPlan(t *testing.T) {
	at := func(target string, n int) []string {
		c := Config{Target: target}
		var out []string
		for i := range n {
			out = append(out, c.wbKillAt(i))
		}
		return out
	}
	cases := map[string][]string{
		TargetSink:   {killAtSink, killAtSink, killAtSink},
		TargetLedger: {"in-write", "after-write", "after-claim", "after-receipt", "in-write"},
		TargetBoth:   {killAtSink, "in-write", "after-write", killAtSink, "after-claim", "after-receipt", killAtSink, "in-write"},
	}
	for target, want := range cases {
		if got := at(target, len(want)); !slices.Equal(got, want) {
			t.Errorf("%s: kills at %v, want %v", target, got, want)
		}
	}
	for _, p := range crashpoint.Points {
		if !slices.Contains(ledgerKillPoints, p) {
			t.Errorf("crash point %s is never killed at", p)
		}
	}
	both := Config{Target: TargetBoth}
	if both.targetOf(0) != TargetLedger || both.targetOf(1) != TargetSink || !both.uses(TargetLedger) || !both.uses(TargetSink) {
		t.Error("both: want every other job to each target")
	}
	if l := (Config{Target: TargetLedger}); l.targetOf(1) != TargetLedger || l.uses(TargetSink) {
		t.Error("ledger: want every job on the ledger")
	}
}

// TestLedgerBook: a job with two entries is a double write, an offer beyond the first is
// counted, and a completed job's receipt must name its key's entry.
func TestLedgerBook(t *testing.T) {
	b := newLedgerBook([]store.LedgerEntry{
		{ID: "ledger-000001", Key: "chaos_00001:writeback:crm_receipt", Offers: 1},
		{ID: "ledger-000002", Key: "chaos_00002:writeback:crm_receipt", Offers: 3},
		{ID: "ledger-000003", Key: "chaos_00001:writeback:other", Offers: 1},
	})
	want := LedgerReport{Entries: 3, Keys: 3, DoubleWrites: 1, Reoffered: 2}
	if b.report != want {
		t.Fatalf("report %+v, want %+v", b.report, want)
	}
	rc := func(key, id string) *handoffv1.Job {
		return &handoffv1.Job{Receipt: &handoffv1.Receipt{IdempotencyKey: key, ExternalId: id}}
	}
	b.checkReceipt(rc("chaos_00002:writeback:crm_receipt", "ledger-000002"))
	b.checkReceipt(rc("chaos_00002:writeback:crm_receipt", "ledger-000009"))
	b.checkReceipt(rc("chaos_00003:writeback:crm_receipt", "ledger-000004"))
	if b.report.ReceiptMismatches != 2 || b.perJob["chaos_00001"] != 2 || b.perJob["chaos_00003"] != 0 {
		t.Fatalf("mismatches %d, per job %v; want 2, and 2 entries for chaos_00001", b.report.ReceiptMismatches, b.perJob)
	}
}

// TestCheckCrashpoints: a binary built without -tags crashpoints (this test's, in a normal
// run) is refused for the ledger target, saying how to build one.
func TestCheckCrashpoints(t *testing.T) {
	err := checkCrashpoints(os.Args[0])
	if crashpoint.Enabled {
		if err != nil {
			t.Fatalf("a -tags crashpoints build was refused: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "-tags crashpoints") {
		t.Fatalf("checkCrashpoints(test binary) = %v; want a refusal naming -tags crashpoints", err)
	}
}
