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

// A duration that does not parse, from a flag or a variable, is named by its flag with
// "--"; a negative one is refused as such.
func TestDurationErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want []string
	}{
		{[]string{"--ttl", "soon"}, "", []string{`--ttl "soon"`, "not a duration"}},
		{[]string{"--ttl", "-1s"}, "", []string{`--ttl "-1s"`, "must not be negative"}},
		{nil, "-1s", []string{"X_TTL", "--ttl", "must not be negative"}},
	} {
		t.Setenv("X_TTL", c.env)
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		b := New(fs)
		var d time.Duration
		b.Duration(&d, "ttl", "X_TTL", time.Second, "ttl")
		err := b.Parse(c.args)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%v) with X_TTL=%q = %v; want %q in it", c.args, c.env, err, w)
			}
		}
	}
}

// A list's variable gives its entries unless a flag is given; then only the flags count.
func TestListFlagsReplaceTheVariable(t *testing.T) {
	t.Setenv("X_LIST", " a ; b;;")
	bind := func(args ...string) []string {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		b := New(fs)
		var l []string
		b.List(&l, "item", "X_LIST", ";", "an item")
		if err := b.Parse(args); err != nil {
			t.Fatal(err)
		}
		return l
	}
	if got := bind(); strings.Join(got, "|") != "a|b" {
		t.Errorf("from the variable: %q", got)
	}
	if got := bind("--item", "c", "--item", "d"); strings.Join(got, "|") != "c|d" {
		t.Errorf("with flags: %q; want only the flags'", got)
	}
}

// --help starts with what the program is, and lists flags with their kinds and the
// environment-only settings; a secret has no flag.
func TestDescribe(t *testing.T) {
	t.Setenv("X_KEY", "s3cret")
	var out strings.Builder
	fs := flag.NewFlagSet("thing", flag.ContinueOnError)
	fs.SetOutput(&out)
	b := New(fs)
	b.Describe("does one thing well", "More about it.")
	var d time.Duration
	var key string
	b.Duration(&d, "wait", "X_WAIT", 2*time.Second, "how long")
	b.Secret(&key, "X_KEY", "the API key")
	if err := b.Parse([]string{"-h"}); err != flag.ErrHelp {
		t.Fatalf("Parse(-h) = %v", err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if first != "thing: does one thing well" {
		t.Errorf("first line %q", first)
	}
	for _, w := range []string{"Usage: thing [flags]", "More about it.", "--wait duration", "(env X_WAIT) (default 2s)", "Environment only:", "X_KEY"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("help lacks %q:\n%s", w, out.String())
		}
	}
	if key != "s3cret" {
		t.Errorf("secret %q", key)
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n != 1 {
		t.Errorf("%d flags; want only --wait: a secret has no flag", n)
	}
}

func TestHostPort(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:50051": true, ":7000": true, "[::1]:0": true, "localhost": false, "h:x": false, "h:70000": false} {
		err := HostPort("listen", addr)
		if (err == nil) != ok || (err != nil && !strings.Contains(err.Error(), "--listen")) {
			t.Errorf("HostPort(%q) = %v", addr, err)
		}
	}
}
