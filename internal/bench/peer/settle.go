package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// A peer's server goes on working after a burst of jobs: Restate's, for one, spent more
// than a CPU for over a second after its first rounds (bench/README.md, issue 22,
// fourteenth round). Measured next, a figure would share the machine with that work, and
// its jobs/s and CPU per job would carry a cost that is not its own. So each measured
// phase of a peer benchmark, the peer's and handoff's alike, starts once the peer's
// server has gone quiet (Settle), and the report says how long that took.

// userHZ is the unit of the CPU times in /proc/PID/stat: the kernel reports them in
// USER_HZ, 100 per second on Linux whatever its own tick rate.
const userHZ = 100

// GroupCPU is the CPU (user and system) used so far by the live processes of process
// group pgid, read from /proc, and how many processes there are. A group with no process
// is an error, as is a pgid below 1: either means the caller measures nothing.
func GroupCPU(pgid int) (time.Duration, int, error) {
	if pgid < 1 {
		return 0, 0, fmt.Errorf("peer: process group %d: want a positive group id", pgid)
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, 0, err
	}
	var ticks int64
	n := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited since the listing
		}
		group, t, err := parseStat(b)
		if err != nil {
			return 0, 0, fmt.Errorf("peer: %s: %w", p, err)
		}
		if group == pgid {
			ticks += t
			n++
		}
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("peer: process group %d has no process", pgid)
	}
	return time.Duration(ticks) * time.Second / userHZ, n, nil
}

// parseStat reads the process group and utime + stime (in USER_HZ ticks) from the text of
// /proc/PID/stat. The command name, field 2, is in parentheses and may hold spaces and
// parentheses itself, so fields are counted from the last ')'.
func parseStat(b []byte) (pgrp int, ticks int64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("no command name in stat")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): pgrp is field 5, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("stat has %d fields after the command name, want at least 13", len(f))
	}
	if pgrp, err = strconv.Atoi(string(f[2])); err != nil {
		return 0, 0, fmt.Errorf("pgrp: %w", err)
	}
	for _, s := range f[11:13] {
		t, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cpu time: %w", err)
		}
		ticks += t
	}
	return pgrp, ticks, nil
}

// Quiet is when Settle calls a process group quiet: it used at most Idle of one CPU over
// each of Windows consecutive windows of Window. Settle gives up after Max.
type Quiet struct {
	Window  time.Duration
	Idle    float64
	Windows int
	Max     time.Duration
}

// DefaultQuiet: under a tenth of a CPU for two windows of 200 ms in a row (at most two of
// /proc's 10 ms ticks each), waiting at most 20 s.
var DefaultQuiet = Quiet{Window: 200 * time.Millisecond, Idle: 0.1, Windows: 2, Max: 20 * time.Second}

// Settled is how a Settle went: how long it waited, the CPU the group used meanwhile, and
// whether it went quiet (false: it gave up at Max).
type Settled struct {
	Waited, CPU time.Duration
	Quiet       bool
}

// Settle waits until process group pgid is quiet by q. A group that cannot be read (no
// process left, a bad pgid) is an error; so is ctx ending.
func Settle(ctx context.Context, pgid int, q Quiet) (Settled, error) {
	if q.Window <= 0 || q.Idle < 0 || q.Windows < 1 || q.Max <= 0 {
		return Settled{}, fmt.Errorf("peer: quiet needs a positive window, windows and max and an idle share >= 0: %+v", q)
	}
	start := time.Now()
	first, _, err := GroupCPU(pgid)
	if err != nil {
		return Settled{}, err
	}
	prev, calm := first, 0
	limit := time.Duration(q.Idle * float64(q.Window))
	tick := time.NewTicker(q.Window)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return Settled{}, ctx.Err()
		case <-tick.C:
		}
		cur, _, err := GroupCPU(pgid)
		if err != nil {
			return Settled{}, err
		}
		if cur-prev <= limit {
			calm++
		} else {
			calm = 0
		}
		prev = cur
		s := Settled{Waited: time.Since(start), CPU: cur - first, Quiet: calm >= q.Windows}
		if s.Quiet || s.Waited >= q.Max {
			return s, nil
		}
	}
}

// SettleLog sums up the Settles of a run, for its report.
type SettleLog struct {
	Phases int `json:"phases"`
	// NotQuiet counts the phases that started after Max without the server going quiet.
	NotQuiet int     `json:"not_quiet"`
	WaitedMs float64 `json:"waited_ms_total"`
	MaxMs    float64 `json:"waited_ms_max"`
	// PeerCPUMs is the CPU the peer's server used while Settle waited: work left over from
	// the phase before, that no figure's CPU per job counts.
	PeerCPUMs float64 `json:"peer_cpu_ms_while_waiting"`
}

// Add records one Settle.
func (l *SettleLog) Add(s Settled) {
	l.Phases++
	if !s.Quiet {
		l.NotQuiet++
	}
	w := Ms(s.Waited)
	l.WaitedMs = Round2(l.WaitedMs + w)
	l.MaxMs = Round2(max(l.MaxMs, w))
	l.PeerCPUMs = Round2(l.PeerCPUMs + Ms(s.CPU))
}

// String is the log as a report's note says it.
func (l SettleLog) String() string {
	return fmt.Sprintf("before each of %d measured phases the peer's server went quiet (under %.0f %% of a CPU for %d × %v; %d phases gave up after %v): waits %.0f ms in all, %.0f ms at most; the server used %.0f ms of CPU meanwhile",
		l.Phases, DefaultQuiet.Idle*100, DefaultQuiet.Windows, DefaultQuiet.Window, l.NotQuiet, DefaultQuiet.Max, l.WaitedMs, l.MaxMs, l.PeerCPUMs)
}
