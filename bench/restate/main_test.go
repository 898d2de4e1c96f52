package main

import (
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
			r := compare("x", h, "peer", tc.peerJPS, tc.peerP50, tc.tT, tc.tL, "")
			if r.ThroughputRatio != tc.wantT || r.LatencyRatio != tc.wantL {
				t.Fatalf("ratios %v, %v; want %v, %v", r.ThroughputRatio, r.LatencyRatio, tc.wantT, tc.wantL)
			}
			if !same(r.ThroughputMet, tc.throughputMet) || !same(r.LatencyMet, tc.latencyMet) {
				t.Fatalf("met %v, %v; want %v, %v", deref(r.ThroughputMet), deref(r.LatencyMet), deref(tc.throughputMet), deref(tc.latencyMet))
			}
		})
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
