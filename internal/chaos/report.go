package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// WriteText prints the report for a person: the figures, the must-be-zero ones marked, and
// the verdict.
func (r *Report) WriteText(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	mark := func(n int) string {
		if n == 0 {
			return "0 (must be 0: ok)"
		}
		return fmt.Sprintf("%d (must be 0: VIOLATION)", n)
	}
	p("handoff chaos: %d jobs in %s (build %s), seed %d, target %s, store %s", r.Jobs.Asked, r.Duration, orDash(r.Build), r.Seed, orDash(r.Target), orDash(r.Store))
	if r.Deployment != "" {
		p("deployment: %s", r.Deployment)
	}
	for _, n := range r.Notes {
		p("  note: %s", n)
	}
	p("jobs")
	p("  submitted                 %d", r.Jobs.Submitted)
	p("  completed                 %d", r.Jobs.Completed)
	p("  escalated                 %d", r.Jobs.Escalated)
	p("  failed                    %d", r.Jobs.Failed)
	p("  lost                      %s", mark(r.Jobs.Lost))
	for _, l := range first(r.Jobs.LostJobs, 10) {
		p("    %s", l)
	}
	for _, k := range sortedKeys(r.Escalations) {
		p("  escalated: %-4d %s", r.Escalations[k], k)
	}
	for _, k := range sortedKeys(r.Failures) {
		p("  failed:    %-4d %s", r.Failures[k], k)
	}
	p("faults")
	p("  kills                     coordinator %d, agentrunner %d, writeback %d (asked %d each)", r.Kills["coordinator"], r.Kills["agentrunner"], r.Kills["writeback"], r.KillsAsked)
	if len(r.WritebackKillsAt) > 0 {
		var at []string
		for _, k := range sortedKeys(r.WritebackKillsAt) {
			at = append(at, fmt.Sprintf("%s %d", k, r.WritebackKillsAt[k]))
		}
		p("  writeback killed at       %s", strings.Join(at, ", "))
	}
	if r.Store == "redis-cluster" {
		p("  redis masters killed      %d (asked %d), failovers %v ms, wait for replica %v", r.RedisRestarts, r.RedisRestartsAsked, r.FailoverMs, r.Wait)
		if r.ReplicationProbe != nil {
			p("  replication probe         %d of %d acknowledged writes lost with their master", r.ReplicationProbe.Lost, r.ReplicationProbe.Acknowledged)
		}
	} else if r.Store == StoreBolt {
		p("  redis restarts            not applicable (no Redis)")
	} else {
		p("  redis restarts            %d (asked %d)", r.RedisRestarts, r.RedisRestartsAsked)
	}
	var crashes []string
	for _, k := range sortedKeys(r.Crashes) {
		crashes = append(crashes, fmt.Sprintf("%s %d", k, r.Crashes[k]))
	}
	p("  crashes (not ours)        %s", orDash(strings.Join(crashes, ", ")))
	p("  hops (calls with retries) %d (%d)", r.Hops, r.Calls)
	p("  re-delivered hops         %d: %d answered duplicate, %d in flight, %d ran the hop first, %d other",
		r.Redelivery.Sent, r.Redelivery.Duplicate, r.Redelivery.InFlight, r.Redelivery.Ran, r.Redelivery.Other)
	for _, k := range sortedKeys(r.Redelivery.OtherReasons) {
		p("    other: %-4d %s", r.Redelivery.OtherReasons[k], k)
	}
	if r.Target != TargetLedger {
		p("sink (external system behind the webhook target)")
		p("  deliveries received       %d", r.Sink.Deliveries)
		p("  distinct keys applied     %d", r.Sink.KeysApplied)
		p("  double writes             %s", mark(r.Sink.DoubleWrites))
		p("  re-sent, absorbed by key  %d", r.Sink.ResentAbsorbed)
		p("  re-sent with another body %s", mark(r.Sink.Conflicts))
	}
	if r.Target != TargetSink {
		p("ledger (the ledger target: upserts by key, entry and receipt in one transaction)")
		p("  entries                   %d", r.Ledger.Entries)
		p("  distinct keys             %d", r.Ledger.Keys)
		p("  double writes             %s", mark(r.Ledger.DoubleWrites))
		if r.Store == "redis-cluster" { // two slots: see finish
			p("  offered again, absorbed   %d (on a cluster entry and receipt are two steps; the ledger's key absorbs it)", r.Ledger.Reoffered)
		} else {
			p("  offered again, absorbed   %s", mark(r.Ledger.Reoffered))
		}
		p("  receipt names another     %s", mark(r.Ledger.ReceiptMismatches))
	}
	p("writes")
	p("  completed without write   %s", mark(r.CompletedWithoutWrite))
	p("  written, not completed    %d", r.WrittenNotCompleted)
	p("fan-out (%d research-brief jobs: two branches, a merge, a sub-job)", r.FanoutJobs)
	p("  branches re-run after completing %s", mark(r.BranchesRerun))
	p("wallets")
	p("  jobs charged extra hops   %d (%d hops beyond those made)", r.OverchargedJobs, r.ExtraHopDebits)
	p("time to resume (from the last kill that broke a job's call to its next progress)")
	for _, k := range sortedKeys(r.TimeToResume) {
		st := r.TimeToResume[k]
		again := ""
		if st.Interrupted > 0 {
			again = fmt.Sprintf("; %d more broken again by a later kill first", st.Interrupted)
		}
		p("  %-25s p50 %5d ms  p99 %5d ms  max %5d ms  (%d jobs%s)", k, st.P50ms, st.P99ms, st.MaxMs, st.Samples, again)
	}
	p("shutdown (SIGTERM)")
	for _, k := range sortedKeys(r.Stops) {
		p("  %-25s %s", k, r.Stops[k])
	}
	if r.WorkDir != "" {
		p("work dir: %s (logs/, sink.jsonl)", r.WorkDir)
	}
	if len(r.Violations) == 0 {
		p("PASS: every job ended, nothing was written twice")
		return
	}
	p("FAIL:")
	for _, v := range r.Violations {
		p("  %s", v)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func first(xs []string, n int) []string {
	if len(xs) > n {
		return append(xs[:n:n], fmt.Sprintf("... and %d more", len(xs)-n))
	}
	return xs
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
