package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/handoffhq/handoff/internal/bench"
)

// TestReplayInProcess replays 200 packages against an in-process platform and checks the
// must-be-zero figures and that every generated invalid kind got its expected status.
func TestReplayInProcess(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"replay", "--n", "200", "--json", "--data", t.TempDir()}, nil, &out, &errb)
	var rep bench.ReplayReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, output is not the JSON report: %v\nstdout:\n%s\nstderr:\n%s", code, err, out.String(), errb.String())
	}
	if code != 0 || !rep.OK {
		t.Fatalf("exit %d, failures %v\n%s", code, rep.Failures, out.String())
	}
	if rep.Sent != 200 {
		t.Fatalf("sent %d, want 200", rep.Sent)
	}
	if n, ok := rep.AgentCallsForRejected.(float64); !ok || n != 0 {
		t.Errorf("agent calls for rejected packages = %v, want 0", rep.AgentCallsForRejected)
	}
	if rep.Writes.DoubleWrites != 0 || rep.TraceBreaks != 0 || rep.Wrong != 0 || rep.RPCError != 0 {
		t.Errorf("double writes %d, trace breaks %d, wrong %d, rpc errors %d; want all 0", rep.Writes.DoubleWrites, rep.TraceBreaks, rep.Wrong, rep.RPCError)
	}
	kinds := map[bench.Kind]*bench.KindReport{}
	for _, k := range rep.Kinds {
		kinds[k.Kind] = k
	}
	for _, k := range append([]bench.Kind{bench.KindValid, bench.KindDuplicate}, bench.InvalidKinds...) {
		kr := kinds[k]
		want := bench.Expected(k).String()[len("ACK_STATUS_"):]
		if kr == nil || kr.Sent == 0 {
			t.Errorf("kind %s was not generated", k)
			continue
		}
		if kr.Expected != want || kr.Got[want] != kr.Sent || kr.Wrong != 0 {
			t.Errorf("kind %s: sent %d, got %v, want all %s", k, kr.Sent, kr.Got, want)
		}
	}
	// One ledger entry per valid job; every duplicate's repeated write got the first receipt.
	valid, dups := kinds[bench.KindValid].Sent, kinds[bench.KindDuplicate].Sent
	if e, ok := rep.Writes.LedgerEntries.(float64); !ok || int(e) != valid || rep.Writes.DuplicateReceipts != dups {
		t.Errorf("ledger entries %v, duplicate receipts %d; want %d and %d", rep.Writes.LedgerEntries, rep.Writes.DuplicateReceipts, valid, dups)
	}
}

func TestReplayUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"replay", "--n", "10", "--invalid", "0.9", "--duplicate", "0.2"}, nil, &out, &errb); code == 0 {
		t.Fatalf("fractions leaving no valid package: exit 0, want non-zero")
	}
}
