package chaos

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"slices"
	"strings"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/store"
)

// The external systems a chaos run writes to (Config.Target).
const (
	// TargetLedger: the writeback's ledger target, the demo ledger in the shared Redis,
	// which upserts by key and, on the writeback's own store, writes each entry and its
	// receipt in one transaction. The writeback is killed at its crash points.
	TargetLedger = "ledger"
	// TargetSink: the webhook target, posting to the harness's HTTP sink. The writeback is
	// killed after the sink applied a write and before it answered.
	TargetSink = "sink"
	// TargetBoth: every other job to each; the writeback's kills alternate between them.
	TargetBoth = "both"
)

// Targets are the values Config.Target takes.
var Targets = []string{TargetLedger, TargetSink, TargetBoth}

// killAtSink is where a writeback kill of a sink write happens.
const killAtSink = "sink-applied"

// ledgerKillPoints are the crash points the writeback's kills of ledger writes go to, in
// turn: first inside the entry+receipt transaction and right after it, where a crash
// used to leave an entry without its receipt.
var ledgerKillPoints = []string{crashpoint.InWrite, crashpoint.AfterWrite, crashpoint.AfterClaim, crashpoint.AfterReceipt}

// Pipeline names: the shipped support ticket writes to the ledger; its webhook variant,
// under another name, to the sink.
const (
	ledgerPipeline = "support-ticket"
	sinkPipeline   = "support-ticket-webhook"
	// fanPipeline is the shipped pipeline with a fan-out and a sub-job (ledger target).
	fanPipeline = "research-brief"
)

// targetOf is job i's target.
func (c *Config) targetOf(i int) string {
	switch c.Target {
	case TargetLedger, TargetSink:
		return c.Target
	}
	if i%2 == 0 {
		return TargetLedger
	}
	return TargetSink
}

// uses reports whether some job writes to target.
func (c *Config) uses(target string) bool { return c.Target == target || c.Target == TargetBoth }

// wbKillAt is where the writeback's n-th kill (from 0) happens: killAtSink or a crash
// point. With both targets every third kill is at the sink.
func (c *Config) wbKillAt(n int) string {
	switch c.Target {
	case TargetSink:
		return killAtSink
	case TargetLedger:
		return ledgerKillPoints[n%len(ledgerKillPoints)]
	}
	if n%3 == 0 {
		return killAtSink
	}
	return ledgerKillPoints[(n-n/3-1)%len(ledgerKillPoints)]
}

// dueWriteback is due(faultWriteback) for a kill at where: only when the plan's next
// writeback kill is to happen there.
func (h *harness) dueWriteback(where string) bool {
	h.planMu.Lock()
	defer h.planMu.Unlock()
	if n := h.next[faultWriteback]; n >= len(h.at[faultWriteback]) || h.cfg.wbKillAt(n) != where {
		return false
	}
	return h.dueLocked(faultWriteback)
}

// killWriteback kills the writeback at where, when it is due there, and counts it.
func (h *harness) killWriteback(where, when string) {
	if !h.dueWriteback(where) {
		return
	}
	if h.killProc(h.writeback, kindWriteback, when) {
		h.planMu.Lock()
		h.killsAt[where]++
		h.planMu.Unlock()
	}
}

// visit is the writeback's crash-point hook: a ledger write passing the point its next
// kill is planned at is killed there (the hook returns once the process is gone).
func (h *harness) visit(v crashpoint.Visit) {
	job, _, _ := strings.Cut(v.Key, ":")
	if h.jobTarget[job] != TargetLedger {
		return
	}
	if v.Point == crashpoint.AfterClaim { // the first point of every ledger write attempt
		h.writes.Add(1)
	}
	h.killWriteback(v.Point, "at its crash point "+v.Point)
}

// checkCrashpoints fails when the writeback in bin was built without crash points, which
// its ledger kills need.
func checkCrashpoints(bin string) error {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("chaos: read the build of %s: %w", bin, err)
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), "crashpoints") {
			return nil
		}
	}
	return fmt.Errorf("chaos: %s was built without -tags crashpoints, which the ledger target's writeback kills need (go build -tags crashpoints ./cmd/writeback, or --target sink)", bin)
}

// LedgerReport is what the ledger (the writeback's ledger target, in the shared Redis)
// holds at the end.
type LedgerReport struct {
	Entries int `json:"entries"`
	Keys    int `json:"distinct_keys"`
	// DoubleWrites counts entries beyond the first for one job: under a second key, or
	// (from a writeback whose ledger did not upsert yet) under the same one. Must be 0.
	DoubleWrites int `json:"double_writes"`
	// Reoffered counts writes offered again for a key that had its entry: the ledger
	// absorbed them (it upserts), but each is a write the writeback let through twice.
	// Must be 0: the entry and its receipt are one transaction, so no retry finds an
	// entry without its receipt.
	Reoffered int `json:"reoffered_absorbed_by_key"`
	// ReceiptMismatches counts completed jobs whose receipt names another entry than
	// their key's. Must be 0.
	ReceiptMismatches int `json:"receipt_mismatches"`
}

// readLedger reads the services' ledger from the run's Redis (the default key prefix).
func (h *harness) readLedger(ctx context.Context) ([]store.LedgerEntry, error) {
	rs, err := store.OpenURL(ctx, h.storeURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: read the ledger: %w", err)
	}
	defer rs.Close()
	es, err := rs.LedgerEntries(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: read the ledger: %w", err)
	}
	return es, nil
}

// ledgerBook indexes the ledger's entries by job and by key.
type ledgerBook struct {
	perJob map[string]int
	byKey  map[string]store.LedgerEntry
	report LedgerReport
}

func newLedgerBook(entries []store.LedgerEntry) *ledgerBook {
	b := &ledgerBook{perJob: map[string]int{}, byKey: map[string]store.LedgerEntry{}}
	b.report.Entries = len(entries)
	for _, e := range entries {
		job, _, _ := strings.Cut(e.Key, ":")
		b.perJob[job]++
		if b.perJob[job] > 1 {
			b.report.DoubleWrites++
		}
		b.byKey[e.Key] = e
		b.report.Reoffered += max(e.Offers-1, 0)
	}
	b.report.Keys = len(b.byKey)
	return b
}

// checkReceipt counts a completed job whose receipt does not name its key's entry.
func (b *ledgerBook) checkReceipt(job *handoffv1.Job) {
	rc := job.GetReceipt()
	if e, ok := b.byKey[rc.GetIdempotencyKey()]; !ok || e.ID != rc.GetExternalId() {
		b.report.ReceiptMismatches++
	}
}
