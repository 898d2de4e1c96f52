package config

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestPrecedence(t *testing.T) {
	t.Setenv("X_LISTEN", "127.0.0.1:9")
	t.Setenv("X_TIMEOUT", "3s")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	b := New(fs)
	var listen string
	var timeout time.Duration
	b.String(&listen, "listen", "X_LISTEN", "127.0.0.1:1", "address")
	b.Duration(&timeout, "timeout", "X_TIMEOUT", time.Second, "timeout")
	if err := b.Parse([]string{"--listen", "127.0.0.1:7"}); err != nil {
		t.Fatal(err)
	}
	if listen != "127.0.0.1:7" || timeout != 3*time.Second {
		t.Fatalf("listen=%s timeout=%s: flag must beat env, env must beat default", listen, timeout)
	}
}

func TestBadEnvNamesTheSetting(t *testing.T) {
	t.Setenv("X_TIMEOUT", "soon")
	t.Setenv("X_N", "many")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	b := New(fs)
	var d time.Duration
	var n int
	b.Duration(&d, "timeout", "X_TIMEOUT", time.Second, "timeout")
	b.Int(&n, "n", "X_N", 1, "count")
	err := b.Parse(nil)
	if err == nil || !strings.Contains(err.Error(), "X_TIMEOUT") || !strings.Contains(err.Error(), "--timeout") || !strings.Contains(err.Error(), "X_N") {
		t.Fatalf("Parse error = %v; want both bad settings named", err)
	}
}
