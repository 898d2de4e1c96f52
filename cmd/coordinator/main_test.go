package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestParseNamesBadSettings(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", testOperatorToken)
	t.Setenv("HANDOFF_HOP_TIMEOUT", "forever")
	_, err := parse(nil)
	if err == nil || !strings.Contains(err.Error(), "HANDOFF_HOP_TIMEOUT") {
		t.Fatalf("parse with a bad env = %v; want the setting named", err)
	}
	t.Setenv("HANDOFF_HOP_TIMEOUT", "")
	if _, err := parse([]string{"--hop-timeout", "0s"}); err == nil || !strings.Contains(err.Error(), "--hop-timeout") {
		t.Fatalf("parse(--hop-timeout 0s) = %v; want it named", err)
	}
}

func TestRunRefusesNoTransportSecurity(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", testOperatorToken)
	err := run(context.Background(), []string{"--store", t.TempDir() + "/c.db", "--listen", "127.0.0.1:0"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "--certs") {
		t.Fatalf("run without --certs or --plaintext-loopback = %v; want a refusal naming --certs", err)
	}
	err = run(context.Background(), []string{"--plaintext-loopback", "--listen", "0.0.0.0:0", "--store", t.TempDir() + "/c.db"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("plaintext on 0.0.0.0 = %v; want a refusal", err)
	}
}

func TestParseLeaseAndDrainSettings(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", testOperatorToken)
	s, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.leaseTTL != 10*time.Second || s.hopRetryFor != 3*time.Minute || s.drainTimeout != 30*time.Second || s.healthInterval != time.Second {
		t.Fatalf("defaults: lease %s, retry-for %s, drain %s, health %s", s.leaseTTL, s.hopRetryFor, s.drainTimeout, s.healthInterval)
	}
	for _, args := range [][]string{{"--lease-ttl", "100ms"}, {"--hop-retry-for", "-1s"}, {"--drain-timeout", "0s"}, {"--health-interval", "1ms"}} {
		if _, err := parse(args); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("parse(%v) = %v; want an error naming %s", args, err, args[0])
		}
	}
}
