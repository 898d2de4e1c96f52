package coordinator

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Run ids sort by creation (the embedded store's locality depends on it) and keep 64
// random bits (they stay unguessable and unique within a millisecond).
func TestRunIDOrder(t *testing.T) {
	format := regexp.MustCompile(`^run_[0-9a-f]{28}$`)
	t0 := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	var ids []string
	seen := map[string]bool{}
	for ms := range 300 {
		at := t0.Add(time.Duration(ms) * time.Millisecond)
		for range 50 { // many in one millisecond: only the random part tells them apart
			id := runIDAt(at)
			if !format.MatchString(id) {
				t.Fatalf("run id %q: want run_ and 28 hex digits", id)
			}
			if seen[id] {
				t.Fatalf("run id %q made twice", id)
			}
			seen[id] = true
			ids = append(ids, id)
		}
		// Every id of a later millisecond sorts after every id of an earlier one.
		if ms > 0 && slices.Max(ids[(ms-1)*50:ms*50]) >= slices.Min(ids[ms*50:]) {
			t.Fatalf("ids of %v do not all sort after those of the millisecond before", at)
		}
	}
	if got, want := ids[0][4:16], "01a233684080"; got != want { // 2026-12-01T21:00:00Z in ms, hex
		t.Errorf("time part of %q = %s, want %s", ids[0], got, want)
	}
	// newRunID stamps the id with the current time, not a fixed one.
	before := time.Now().UnixMilli()
	id := newRunID()
	after := time.Now().UnixMilli()
	if !format.MatchString(id) {
		t.Fatalf("newRunID() = %q: want run_ and 28 hex digits", id)
	}
	if ms, err := strconv.ParseInt(id[4:16], 16, 64); err != nil || ms < before || ms > after {
		t.Errorf("newRunID() = %q: time part %s is not a Unix millisecond in [%d, %d]", id, id[4:16], before, after)
	}
	// The random part varies in every digit position: not a counter, not a constant.
	for pos := 16; pos < 32; pos++ {
		digits := map[byte]bool{}
		for _, id := range ids {
			digits[id[pos]] = true
		}
		if len(digits) < 16 {
			t.Errorf("digit %d of the random part took %d values over %d ids, want all 16", pos-16, len(digits), len(ids))
		}
	}
}
