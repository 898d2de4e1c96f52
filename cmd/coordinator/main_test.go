package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseNamesBadSettings(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", testOperatorToken)
	t.Setenv("HANDOFF_HOP_TIMEOUT", "forever")
	_, err := parse(nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "HANDOFF_HOP_TIMEOUT") {
		t.Fatalf("parse with a bad env = %v; want the setting named", err)
	}
	t.Setenv("HANDOFF_HOP_TIMEOUT", "")
	if _, err := parse([]string{"--hop-timeout", "0s"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--hop-timeout") {
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
	s, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.leaseTTL != 1500*time.Millisecond || s.hopRetryFor != 3*time.Minute || s.drainTimeout != 30*time.Second || s.healthInterval != time.Second {
		t.Fatalf("defaults: lease %s, retry-for %s, drain %s, health %s", s.leaseTTL, s.hopRetryFor, s.drainTimeout, s.healthInterval)
	}
	for _, args := range [][]string{{"--lease-ttl", "100ms"}, {"--hop-retry-for", "-1s"}, {"--drain-timeout", "0s"}, {"--health-interval", "1ms"}} {
		if _, err := parse(args, io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("parse(%v) = %v; want an error naming %s", args, err, args[0])
		}
	}
}

// Every bad value is refused at start, naming its flag (and its variable when it came from one).
func TestValidateNamesTheFlag(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", testOperatorToken)
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--listen", "nope"}, nil, "--listen"},
		{[]string{"--listen", "127.0.0.1:70000"}, nil, "--listen"},
		{[]string{"--metrics-listen", "9464"}, nil, "--metrics-listen"},
		{[]string{"--store", "mysql://h:1"}, nil, "--store"},
		{[]string{"--drain-timeout", "soon"}, nil, "--drain-timeout"},
		{nil, map[string]string{"HANDOFF_LEASE_TTL": "-5s"}, "HANDOFF_LEASE_TTL"},
		{nil, map[string]string{"HANDOFF_LEASE_TTL": "-5s"}, "--lease-ttl"},
		{[]string{"--operator-token", "short"}, nil, "--operator-token"},
		{[]string{"--escalation-webhook", "ftp://x"}, nil, "--escalation-webhook"},
		{[]string{"--pii-vault", " "}, nil, "--pii-vault"},
	} {
		t.Run(strings.Join(c.args, " ")+c.want, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			if _, err := parse(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("parse(%v) = %v; want an error naming %s", c.args, err, c.want)
			}
		})
	}
}

// --help says what the binary is on its first line, then lists every flag.
func TestHelpSaysWhatItIs(t *testing.T) {
	var out bytes.Buffer
	if _, err := parse([]string{"--help"}, &out); err != flag.ErrHelp {
		t.Fatalf("parse(--help) = %v, want flag.ErrHelp", err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.HasPrefix(first, "coordinator: runs the rail") {
		t.Errorf("first line %q; want it to say what the coordinator is", first)
	}
	for _, f := range []string{"--operator-token", "--lease-ttl duration", "HANDOFF_HOP_TIMEOUT", "--plaintext-loopback", "--pii-vault", "HANDOFF_PII_VAULT"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help lacks %q:\n%s", f, out.String())
		}
	}
}
