package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/bench/peer"
)

func TestCompareJudgesTargets(t *testing.T) {
	h := &peer.Figure{Name: "J_bolt", P50ms: 2, JobsPerSec: 2000}
	for _, tc := range []struct {
		name                      string
		peerJPS, peerP50, tT, tL  float64
		wantT, wantL              float64
		throughputMet, latencyMet *bool
	}{
		{"both met", 190, 22.6, 10, 10, 10.53, 11.3, ptr(true), ptr(true)},
		{"both missed", 400, 15, 10, 10, 5, 7.5, ptr(false), ptr(false)},
		{"no targets: not judged", 608, 6.4, 0, 0, 3.29, 3.2, nil, nil},
		{"a peer without throughput gives no ratio", 0, 6.4, 10, 0, 0, 3.2, ptr(false), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := compare("x", h, &peer.Figure{Name: "peer", JobsPerSec: tc.peerJPS, P50ms: tc.peerP50}, tc.tT, tc.tL, 2, "")
			if r.ThroughputRatio != tc.wantT || r.LatencyRatio != tc.wantL {
				t.Fatalf("ratios %v, %v; want %v, %v", r.ThroughputRatio, r.LatencyRatio, tc.wantT, tc.wantL)
			}
			if !same(r.ThroughputMet, tc.throughputMet) || !same(r.LatencyMet, tc.latencyMet) {
				t.Fatalf("met %v, %v; want %v, %v", deref(r.ThroughputMet), deref(r.LatencyMet), deref(tc.throughputMet), deref(tc.latencyMet))
			}
		})
	}
}

// TestCompareRoundByRound: with both figures' rounds, a ratio carries its value in each
// round alone and how many rounds met each target; a peer without rounds (Temporal's stated
// figures) or with a different number gives none.
func TestCompareRoundByRound(t *testing.T) {
	h := &peer.Figure{Name: "J_bolt", P50ms: 8, JobsPerSec: 700, RoundsJPS: []float64{700, 1100, 500}, RoundsP50: []float64{8, 2, 10}}
	p := &peer.Figure{Name: "hop relay", P50ms: 28, JobsPerSec: 100, RoundsJPS: []float64{100, 100, 100}, RoundsP50: []float64{28, 30, 33}}
	r := compare("x", h, p, 10, 10, 2, "")
	if !slices.Equal(r.ThroughputRounds, []float64{7, 11, 5}) || !slices.Equal(r.LatencyRounds, []float64{3.5, 15, 3.3}) {
		t.Fatalf("rounds %v, %v; want [7 11 5], [3.5 15 3.3]", r.ThroughputRounds, r.LatencyRounds)
	}
	if r.ThroughputRoundsMet == nil || *r.ThroughputRoundsMet != 1 || r.LatencyRoundsMet == nil || *r.LatencyRoundsMet != 1 {
		t.Fatalf("rounds met %v, %v; want 1 and 1", r.ThroughputRoundsMet, r.LatencyRoundsMet)
	}
	if got := spread(r.ThroughputRounds, r.ThroughputRoundsMet); got != " [rounds 5.00 to 11.00, 1 of 3 met it]" {
		t.Errorf("spread = %q", got)
	}
	// No target: rounds, but no count.
	if r := compare("x", h, p, 0, 0, 2, ""); r.ThroughputRounds == nil || r.ThroughputRoundsMet != nil || r.LatencyRoundsMet != nil {
		t.Errorf("untargeted ratio = %+v, want rounds and no counts", r)
	}
	for _, other := range []*peer.Figure{
		{Name: "stated", JobsPerSec: 63, P50ms: 30},
		{Name: "short", JobsPerSec: 100, P50ms: 28, RoundsJPS: []float64{100, 100}, RoundsP50: []float64{28, 28}},
		{Name: "a round at 0", JobsPerSec: 100, P50ms: 28, RoundsJPS: []float64{100, 0, 100}, RoundsP50: []float64{28, 28, 28}},
	} {
		r := compare("x", h, other, 10, 10, 2, "")
		if other.Name == "a round at 0" {
			if r.ThroughputRounds != nil || r.LatencyRounds == nil {
				t.Errorf("%s: rounds %v, %v; want no throughput rounds, latency rounds kept", other.Name, r.ThroughputRounds, r.LatencyRounds)
			}
			continue
		}
		if r.ThroughputRounds != nil || r.LatencyRounds != nil || r.ThroughputRoundsMet != nil || r.LatencyRoundsMet != nil {
			t.Errorf("%s: %+v, want no rounds", other.Name, r)
		}
	}
}

// TestCompareCPUCeiling: with handoff's CPU per job measured, a ratio carries the jobs/s its
// CPUs allow at that cost and that over the peer's; without it, neither.
func TestCompareCPUCeiling(t *testing.T) {
	p := &peer.Figure{Name: "hop relay", P50ms: 50, JobsPerSec: 55}
	r := compare("x", &peer.Figure{Name: "J_bolt", P50ms: 20, JobsPerSec: 330, CPUms: 4.5}, p, 10, 10, 2, "")
	if r.CPUCeiling != 444 || r.CPUCeilingOverPeer != 8.08 {
		t.Errorf("at 4.5 ms per job on 2 CPUs: ceiling %v (%v × the peer); want 444 (8.08 ×)", r.CPUCeiling, r.CPUCeilingOverPeer)
	}
	if r := compare("x", &peer.Figure{Name: "J_bolt", P50ms: 20, JobsPerSec: 330, CPUms: 1.5}, p, 10, 10, 4, ""); r.CPUCeiling != 2667 || r.CPUCeilingOverPeer != 48.48 {
		t.Errorf("at 1.5 ms per job on 4 CPUs: ceiling %v (%v ×); want 2667 (48.48 ×)", r.CPUCeiling, r.CPUCeilingOverPeer)
	}
	if r := compare("x", &peer.Figure{Name: "J_bolt", P50ms: 20, JobsPerSec: 330}, p, 10, 10, 2, ""); r.CPUCeiling != 0 || r.CPUCeilingOverPeer != 0 {
		t.Errorf("no CPU measured: ceiling %v (%v ×); want neither", r.CPUCeiling, r.CPUCeilingOverPeer)
	}
	if r := compare("x", &peer.Figure{Name: "J_bolt", P50ms: 20, JobsPerSec: 330, CPUms: 4.5}, &peer.Figure{Name: "none"}, 10, 10, 2, ""); r.CPUCeiling != 444 || r.CPUCeilingOverPeer != 0 {
		t.Errorf("a peer without jobs/s: ceiling %v (%v ×); want 444 and no ratio", r.CPUCeiling, r.CPUCeilingOverPeer)
	}
}

func TestConfigBindsLoopbackPorts(t *testing.T) {
	c := config(1, 2, 3)
	for _, want := range []string{`listen-mode = "tcp"`, `bind-ip = "127.0.0.1"`, "bind-port = 1\n", "[admin]\nbind-port = 2\n", "[ingress]\nbind-port = 3\n"} {
		if !strings.Contains(c, want) {
			t.Errorf("config lacks %q:\n%s", want, c)
		}
	}
}

func ptr(b bool) *bool { return &b }

func same(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func deref(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}
