package main

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/handoffhq/handoff/internal/bench/peer"
)

// TestRatios: each handoff figure is compared with Temporal's by issue 6's targets (kept
// for history), round by round, and J_redis alone also by issue 22's (>= 30 × Temporal's
// jobs/s, with how many rounds alone met it).
func TestRatios(t *testing.T) {
	temporal := &peer.Figure{Name: "Temporal", P50ms: 50, JobsPerSec: 40, RoundsJPS: []float64{40, 50, 20}, RoundsP50: []float64{50, 40, 60}}
	bolt := &peer.Figure{Key: "J_bolt", Name: "handoff J_bolt", P50ms: 0.8, JobsPerSec: 2200, RoundsJPS: []float64{2200, 1000, 1100}, RoundsP50: []float64{0.8, 1, 2}}
	redis := &peer.Figure{Key: "J_redis", Name: "handoff J_redis", P50ms: 4, JobsPerSec: 1240, RoundsJPS: []float64{1240, 1400, 500}, RoundsP50: []float64{4, 4, 5}}
	rs := ratios(temporal, []*peer.Figure{bolt, redis}, 2)
	if len(rs) != 2 {
		t.Fatalf("%d ratios, want 2", len(rs))
	}
	b, r := rs[0], rs[1]
	if b.Handoff != bolt.Name || r.Handoff != redis.Name {
		t.Fatalf("ratios of %q and %q", b.Handoff, r.Handoff)
	}
	if b.ThroughputRatio != 55 || b.LatencyRatio != 62.5 || !b.ThroughputMet || !b.LatencyMet {
		t.Errorf("J_bolt: %+v, want 55 × and 62.5 ×, both of issue 6's targets met", b)
	}
	if want := []float64{55, 20, 55}; !slices.Equal(b.ThroughputRounds, want) {
		t.Errorf("J_bolt jobs/s ratio per round %v, want %v", b.ThroughputRounds, want)
	}
	if want := []float64{62.5, 40, 30}; !slices.Equal(b.LatencyRounds, want) {
		t.Errorf("J_bolt p50 ratio per round %v, want %v", b.LatencyRounds, want)
	}
	if b.Issue22Target != 0 || b.Issue22Met != nil || b.Issue22RoundsMet != nil {
		t.Errorf("J_bolt judged by issue 22's J_redis target: %+v", b)
	}
	if r.ThroughputRatio != 31 || r.ThroughputMet || r.LatencyMet {
		t.Errorf("J_redis: %+v, want 31 × and issue 6's targets missed", r)
	}
	if r.Issue22Target != 30 || r.Issue22Met == nil || !*r.Issue22Met {
		t.Fatalf("J_redis at 31 × Temporal: issue 22's 30 × not met: %+v", r)
	}
	// Rounds alone: 31, 28, 25: one met 30 ×.
	if r.Issue22RoundsMet == nil || *r.Issue22RoundsMet != 1 {
		t.Errorf("J_redis rounds that met 30 ×: %v of %v, want 1", r.Issue22RoundsMet, r.ThroughputRounds)
	}

	redis.JobsPerSec = 1200 // 30 × exactly: met
	if r := ratios(temporal, []*peer.Figure{redis}, 2)[0]; r.Issue22Met == nil || !*r.Issue22Met {
		t.Errorf("J_redis at 30 × Temporal did not meet issue 22's >= 30 ×: %+v", r)
	}
	redis.JobsPerSec = 1170 // 29.25 ×
	if r := ratios(temporal, []*peer.Figure{redis}, 2)[0]; r.Issue22Met == nil || *r.Issue22Met {
		t.Errorf("J_redis at 29.25 × Temporal met issue 22's 30 ×: %+v", r)
	}
}

// A Temporal run with no jobs/s (or a handoff figure with no p50) gives ratios of 0 that
// meet nothing, and the report still encodes: JSON has no Inf.
func TestRatiosWithoutFigures(t *testing.T) {
	rs := ratios(&peer.Figure{Name: "Temporal", P50ms: 50}, []*peer.Figure{{Key: "J_redis", Name: "handoff J_redis", JobsPerSec: 900}}, 2)
	r := rs[0]
	if r.ThroughputRatio != 0 || r.LatencyRatio != 0 || r.ThroughputMet || r.LatencyMet || r.Issue22Met == nil || *r.Issue22Met {
		t.Fatalf("ratio over a Temporal with no jobs/s: %+v", r)
	}
	if r.ThroughputRounds != nil || r.LatencyRounds != nil || r.Issue22RoundsMet != nil {
		t.Errorf("rounds without rounds: %+v", r)
	}
	if _, err := json.Marshal(&report{Ratios: rs}); err != nil {
		t.Fatalf("report does not encode: %v", err)
	}
}

// A NaN or Inf figure gives ratios of 0 that meet nothing, and the report still encodes;
// issue 22's target is judged on the figure keyed J_redis, whatever its display name.
func TestRatiosNotFinite(t *testing.T) {
	temporal := &peer.Figure{Name: "Temporal", P50ms: 50, JobsPerSec: 40}
	for _, h := range []*peer.Figure{
		{Key: "J_redis", Name: "handoff J_redis", JobsPerSec: math.NaN(), P50ms: math.NaN()},
		{Key: "J_redis", Name: "handoff J_redis", JobsPerSec: math.Inf(1), P50ms: math.Inf(1)},
	} {
		r := ratios(temporal, []*peer.Figure{h}, 2)[0]
		if r.ThroughputRatio != 0 || r.LatencyRatio != 0 || r.ThroughputMet || r.Issue22Met == nil || *r.Issue22Met {
			t.Errorf("ratio over %v jobs/s: %+v", h.JobsPerSec, r)
		}
		if _, err := json.Marshal(&report{Ratios: []ratio{r}}); err != nil {
			t.Errorf("report over %v jobs/s does not encode: %v", h.JobsPerSec, err)
		}
	}
	r := ratios(temporal, []*peer.Figure{{Key: "J_redis", Name: "J_redis (renamed)", JobsPerSec: 1300, P50ms: 4}}, 2)[0]
	if r.Issue22Met == nil || !*r.Issue22Met {
		t.Errorf("J_redis under another name not judged by issue 22: %+v", r)
	}
}

// TestRatiosCPUCeiling: a figure whose CPU per job was measured carries the jobs/s the
// machine's CPUs allow at that cost and that over Temporal's; one without carries neither.
func TestRatiosCPUCeiling(t *testing.T) {
	temporal := &peer.Figure{Name: "Temporal", P50ms: 100, JobsPerSec: 18}
	rs := ratios(temporal, []*peer.Figure{
		{Key: "J_redis", Name: "handoff J_redis", P50ms: 7, JobsPerSec: 286, CPUms: 6},
		{Key: "J_bolt", Name: "handoff J_bolt", P50ms: 15, JobsPerSec: 340},
	}, 2)
	if r := rs[0]; r.CPUCeiling != 333 || r.CPUCeilingOverTemporal != 18.52 {
		t.Errorf("J_redis at 6 ms per job on 2 CPUs: ceiling %v (%v × Temporal); want 333 (18.52 ×)", r.CPUCeiling, r.CPUCeilingOverTemporal)
	}
	if r := rs[1]; r.CPUCeiling != 0 || r.CPUCeilingOverTemporal != 0 {
		t.Errorf("J_bolt without CPU: ceiling %v (%v ×); want neither", r.CPUCeiling, r.CPUCeilingOverTemporal)
	}
	if r := ratios(temporal, []*peer.Figure{{Key: "J_redis", Name: "J_redis", JobsPerSec: 286, CPUms: 6}}, 4)[0]; r.CPUCeiling != 667 {
		t.Errorf("on 4 CPUs: ceiling %v; want 667", r.CPUCeiling)
	}
}
