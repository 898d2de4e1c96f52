package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

func TestRunRefusesWithoutSecurity(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	base := []string{"--store", filepath.Join(dir, "r.db"), "--artifacts", filepath.Join(dir, "a"), "--listen", "127.0.0.1:0"}
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"neither":            {nil, "--certs"},
		"plaintext off host": {[]string{"--plaintext-loopback", "--listen", "0.0.0.0:0"}, "not a loopback"},
		"bad store scheme":   {[]string{"--plaintext-loopback", "--store", "mysql://h:1"}, "--store"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(append(append([]string{}, base...), c.args...), log)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run: %v, want an error naming %q", err, c.want)
			}
		})
	}
}

// Two processes given the same redis:// --store share completion records. Needs a Redis
// (storetest: HANDOFF_TEST_REDIS or 127.0.0.1:6379; fails under CI without one, skipped
// elsewhere). The --store URLs name a prefix unique to the test, deleted afterwards.
func TestOpenStoreRedisShared(t *testing.T) {
	prefix := "?prefix=" + url.QueryEscape(storetest.RedisPrefix(t))
	ctx := context.Background()
	specA := "redis://" + storetest.RedisAddr() + "/0" + prefix
	a, err := store.OpenURL(ctx, specA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := store.OpenURL(ctx, "redis://"+storetest.RedisAddr()+prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if nameA := store.Redact(specA); strings.Contains(nameA, "@") {
		t.Errorf("store name %q", nameA)
	}
	key := "agentrunner-cmd-test:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	st, _, owner, err := a.Claim(ctx, key, time.Minute)
	if err != nil || st != store.Claimed {
		t.Fatalf("claim: %v %v", st, err)
	}
	defer a.Release(ctx, key, owner)
	if st, _, err := b.Lookup(ctx, key); err != nil || st != store.Pending {
		t.Fatalf("the other process sees %v %v, want pending", st, err)
	}
}

// HANDOFF_EXEC_AGENTS and HANDOFF_LLM_API_KEY go through the Binder like every setting:
// the variable's entries are the list unless --exec is given; the key has no flag.
func TestParseExecAndKeyFromTheEnvironment(t *testing.T) {
	t.Setenv("HANDOFF_EXEC_AGENTS", "draft=/bin/draft --fast; judge:kb.search=/bin/judge ;")
	t.Setenv("HANDOFF_LLM_API_KEY", "sk-test")
	s, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"draft=/bin/draft --fast", "judge:kb.search=/bin/judge"}; !slices.Equal(s.execAgents, want) || s.llmAPIKey != "sk-test" {
		t.Fatalf("exec %q key %q; want %q and the key", s.execAgents, s.llmAPIKey, want)
	}
	s, err = parse([]string{"--exec", "intake=/bin/intake", "--exec", "retrieve=/bin/retrieve"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"intake=/bin/intake", "retrieve=/bin/retrieve"}; !slices.Equal(s.execAgents, want) {
		t.Fatalf("exec %q with flags; want only the flags' %q", s.execAgents, want)
	}
	var out bytes.Buffer
	if _, err := parse([]string{"--llm-api-key", "sk"}, &out); err == nil {
		t.Fatal("--llm-api-key was accepted; the key must come from the environment only")
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "nope"}, "--listen"},
		{[]string{"--metrics-listen", "localhost:x"}, "--metrics-listen"},
		{[]string{"--store", "mysql://h:1"}, "--store"},
		{[]string{"--artifacts", ""}, "--artifacts"},
		{[]string{"--stage-timeout", "0s"}, "--stage-timeout"},
		{[]string{"--stage-timeout", "later"}, "--stage-timeout"},
		{[]string{"--result-ttl", "-1h"}, "--result-ttl"},
		{[]string{"--llm-price", "-3"}, "--llm-price"},
		{[]string{"--otel-genai=maybe"}, "otel-genai"}, // the flag package names it -otel-genai
	} {
		if _, err := parse(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse(%v) = %v; want an error naming %s", c.args, err, c.want)
		}
	}
}

func TestHelpSaysWhatItIs(t *testing.T) {
	var out bytes.Buffer
	if _, err := parse([]string{"-h"}, &out); err != flag.ErrHelp {
		t.Fatalf("parse(-h) = %v, want flag.ErrHelp", err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.HasPrefix(first, "agentrunner: hosts stage agents") {
		t.Errorf("first line %q; want it to say what the agent runner is", first)
	}
	for _, want := range []string{"--exec value", "HANDOFF_EXEC_AGENTS", "Environment only:", "HANDOFF_LLM_API_KEY", "--stage-timeout duration", "--otel-genai", "HANDOFF_OTEL_GENAI"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
}

// The GenAI spans are off unless the flag or its variable turns them on.
func TestOtelGenAISetting(t *testing.T) {
	s, err := parse(nil, io.Discard)
	if err != nil || s.otelGenAI {
		t.Fatalf("default otel-genai = %v (%v), want off", s.otelGenAI, err)
	}
	if s, err = parse([]string{"--otel-genai"}, io.Discard); err != nil || !s.otelGenAI {
		t.Fatalf("--otel-genai = %v (%v), want on", s.otelGenAI, err)
	}
	t.Setenv("HANDOFF_OTEL_GENAI", "true")
	if s, err = parse(nil, io.Discard); err != nil || !s.otelGenAI {
		t.Fatalf("HANDOFF_OTEL_GENAI=true = %v (%v), want on", s.otelGenAI, err)
	}
	t.Setenv("HANDOFF_OTEL_GENAI", "sometimes")
	if _, err = parse(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "HANDOFF_OTEL_GENAI") {
		t.Fatalf("HANDOFF_OTEL_GENAI=sometimes = %v, want an error naming it", err)
	}
}
