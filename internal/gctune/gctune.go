// Package gctune sets the garbage collector's policy of a handoff process at start-up: how
// much the heap may grow between collections (GOGC) and the soft memory limit the collector
// keeps it under (GOMEMLIMIT).
//
// A hop allocates about 42 KB in ~630 short-lived objects (the package decoded and checked,
// the stream's frames, the store's replies) over a live heap of a few megabytes, so Go's
// default (GOGC=100: collect each time the heap doubles) spends 10–20 % of a busy service's
// CPU in the collector. At GOGC=400 a five-stage job on bbolt costs about 30 % less CPU at
// 32 in flight (1.6–1.8 ms against 2.5; bench/README.md, "Issue 22, fourth round"). The price is memory: the heap may reach five times its live size between
// collections instead of twice. So the soft limit comes with it: GOMEMLIMIT is set to 90 %
// of the container's memory limit (cgroup v1 or v2), and the collector runs as often as it
// must to stay under it, whatever GOGC says. Without a container limit none is set.
//
// Both stay the operator's: a GOGC or GOMEMLIMIT in the environment is used as it is (the Go
// runtime reads them), AUTOMEMLIMIT=0.8 gives the heap another share of the container's
// limit, and AUTOMEMLIMIT=off keeps the limit unset.
package gctune

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGOGC is the GOGC a handoff process runs with when the environment sets none.
const DefaultGOGC = 400

// memLimitRatio is the share of the container's memory limit given to the Go heap as its
// soft limit; the rest is for what the limit does not count (bbolt's mapped file, the
// kernel's buffers).
const memLimitRatio = 0.9

// Policy is what Apply set, and where each value came from.
type Policy struct {
	GOGC     int    // -1: off
	GOGCFrom string // "GOGC" (the environment) or "default"
	// MemLimit is the soft memory limit in bytes, math.MaxInt64 for none.
	MemLimit     int64
	MemLimitFrom string // "GOMEMLIMIT" (the environment), "cgroup", "none" (with why, when the cgroup could not be read) or "AUTOMEMLIMIT=off"
}

// LogValue is the policy as a log line's attributes.
func (p Policy) LogValue() slog.Value {
	return slog.GroupValue(slog.Int("gogc", p.GOGC), slog.String("gogc_from", p.GOGCFrom),
		slog.Int64("memory_limit", p.MemLimit), slog.String("memory_limit_from", p.MemLimitFrom))
}

// gogc decides the GOGC: the environment's value (which the runtime already applied) or
// DefaultGOGC when it sets none. A value the runtime cannot read is an error naming it:
// the runtime would quietly run with 100 instead.
func gogc(env string) (value int, from string, err error) {
	if env == "" { // unset, or set empty: the runtime reads both as unset
		return DefaultGOGC, "default", nil
	}
	// As the runtime reads it (readGOGC): "off" in lower case, else a 32-bit number. Any
	// other spelling ("OFF", 1e3, 2^32) it runs at 100, whatever the policy would say.
	if env == "off" {
		return -1, "GOGC", nil
	}
	n64, err := strconv.ParseInt(env, 10, 32)
	n := int(n64)
	if err != nil || n < 0 {
		return 0, "", fmt.Errorf("GOGC=%q: want a whole number of percent (100 is Go's default, %d handoff's) or off", env, DefaultGOGC)
	}
	return n, "GOGC", nil
}

// Apply sets the policy for this process, once, at start-up (it changes process-wide
// runtime settings: call it from a main, not from a library or a test).
func Apply() (Policy, error) { return apply(memlimit.FromCgroup) }

// Start is Apply for a service's main: a policy it cannot apply stops the process (exit 2,
// "<name>: <why>" on standard error), and the one it applies is logged at info.
func Start(name string, log *slog.Logger) {
	p, err := Apply()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	log.Info("gc policy", "gc", p)
}

// apply is Apply with the container's memory limit read from provider.
func apply(provider memlimit.Provider) (Policy, error) {
	g, from, err := gogc(os.Getenv("GOGC"))
	if err != nil {
		return Policy{}, err
	}
	if from == "default" {
		debug.SetGCPercent(g)
	}
	p := Policy{GOGC: g, GOGCFrom: from}
	if p.MemLimitFrom, err = memLimitSource(); err != nil {
		return Policy{}, err
	}
	if p.MemLimitFrom == "cgroup" {
		if v, ok := os.LookupEnv("AUTOMEMLIMIT"); ok && v == "" {
			os.Unsetenv("AUTOMEMLIMIT") // empty is unset here; memlimit would refuse it
		}
		limit, err := memlimit.Set(memlimit.WithRatio(memLimitRatio), memlimit.WithProvider(provider),
			memlimit.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		switch {
		case errors.Is(err, memlimit.ErrNoLimit), err == nil && limit == math.MaxInt64:
			p.MemLimitFrom = "none"
		case err != nil:
			// No container limit to read (not Linux, no cgroup memory controller): none, as
			// Go's default; the reason goes in the start-up line.
			p.MemLimitFrom = "none (" + err.Error() + ")"
		}
	}
	p.MemLimit = debug.SetMemoryLimit(-1)
	return p, nil
}

// memLimitSource says who sets the soft memory limit: the environment (GOMEMLIMIT, which the
// runtime already applied, or AUTOMEMLIMIT=off), or the container's limit (at
// AUTOMEMLIMIT's share of it when that is a number).
func memLimitSource() (string, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return "GOMEMLIMIT", nil
	}
	v, ok := os.LookupEnv("AUTOMEMLIMIT")
	switch {
	case !ok || v == "":
		return "cgroup", nil
	case v == "off":
		return "AUTOMEMLIMIT=off", nil
	}
	// A ratio of the container's limit (memlimit reads it from the environment itself).
	if r, err := strconv.ParseFloat(v, 64); err != nil || !(r > 0 && r <= 1) {
		return "", fmt.Errorf("AUTOMEMLIMIT=%q: want off or the share of the container's memory limit for the heap, in (0, 1] (default %.1f)", v, memLimitRatio)
	}
	return "cgroup", nil
}
