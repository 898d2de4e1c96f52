package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestChaosUsage: bad flags are usage errors (exit 2) that name the flag; --help prints the
// usage. The harness itself is tested in internal/chaos.
func TestChaosUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"chaos", "--help"}, 0, "Usage: handoff chaos"},
		{[]string{"chaos", "--jobs", "0"}, 2, "--jobs"},
		{[]string{"chaos", "--redeliver", "1.5"}, 2, "--redeliver"},
		{[]string{"chaos", "--kills", "-1"}, 2, "--kills"},
		{[]string{"chaos", "--lease-ttl", "10ms"}, 2, "--lease-ttl"},
		{[]string{"chaos", "--target", "crm"}, 2, `--target must be one of ledger, sink, both, got "crm"`},
		{[]string{"chaos", "--store", "sqlite"}, 2, `--store must be one of redis, redis-cluster, bbolt, got "sqlite"`},
		// bbolt runs handoff up in one process: no Redis to restart, and up's own lease.
		{[]string{"chaos", "--store", "bbolt", "--redis-restarts", "2"}, 2, "--redis-restarts and --lease-ttl do not apply to --store bbolt"},
		{[]string{"chaos", "--store", "bbolt", "--lease-ttl", "3s"}, 2, "--redis-restarts and --lease-ttl do not apply to --store bbolt"},
		{[]string{"chaos", "--store", "bbolt", "--wait"}, 2, "--wait needs --store redis-cluster"},
		{[]string{"chaos", "--wait"}, 2, "--wait needs --store redis-cluster"},
		{[]string{"chaos", "extra"}, 2, "unexpected argument"},
		{[]string{"chaos", "--nope"}, 2, "nope"},
	} {
		var out, errOut bytes.Buffer
		code := run(c.args, strings.NewReader(""), &out, &errOut)
		if code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
			t.Errorf("%v: exit %d, output %q; want exit %d mentioning %q", c.args, code, out.String()+errOut.String(), c.code, c.want)
		}
	}
}
