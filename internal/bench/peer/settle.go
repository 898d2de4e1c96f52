package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// A peer's server goes on working after a burst of jobs: Restate's, for one, spent more
// than a CPU for over a second after its first rounds (bench/README.md, issue 22,
// fourteenth round). Measured next, a figure would share the machine with that work, and
// its jobs/s and CPU per job would carry a cost that is not its own. So each measured
// phase of a peer benchmark, the peer's and handoff's alike, starts once both the peer's
// server and the bench's own process (handoff's services, the peer's worker or SDK
// endpoint) have gone quiet (Settle), and the report says how long that took.

// userHZ is the unit of the CPU times in /proc/PID/stat: the kernel reports them in
// USER_HZ, 100 per second on Linux whatever its own tick rate.
const userHZ = 100

// tick is /proc's CPU time resolution: a window must hold enough of them to tell a share.
const tick = time.Second / userHZ

// A Meter reads a cumulative CPU time: Settle watches how fast it grows.
type Meter func() (time.Duration, error)

// Group meters the live processes of process group pgid (GroupCPU).
func Group(pgid int) Meter {
	return func() (time.Duration, error) {
		cpu, _, err := GroupCPU(pgid)
		return cpu, err
	}
}

// Self meters this process (getrusage: every thread, user and system).
func Self() Meter {
	return func() (time.Duration, error) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return 0, fmt.Errorf("peer: getrusage: %w", err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
	}
}

// Sum meters the sum of ms.
func Sum(ms ...Meter) Meter {
	return func() (time.Duration, error) {
		var total time.Duration
		for _, m := range ms {
			d, err := m()
			if err != nil {
				return 0, err
			}
			total += d
		}
		return total, nil
	}
}

// GroupCPU is the CPU (user and system) used so far by the live processes of process
// group pgid and by the children they have waited for, read from /proc, and how many live
// processes there are. Zombies are not live: a server that died is not a quiet one. A
// group with no live process is an error, as is a pgid below 1 and a machine without
// /proc: each means the caller measures nothing.
func GroupCPU(pgid int) (time.Duration, int, error) {
	if pgid < 1 {
		return 0, 0, fmt.Errorf("peer: process group %d: want a positive group id", pgid)
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return 0, 0, fmt.Errorf("peer: reading a process group's CPU needs Linux's /proc: %w", err)
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
		st, err := parseStat(b)
		if err != nil {
			return 0, 0, fmt.Errorf("peer: %s: %w", p, err)
		}
		if st.pgrp == pgid && st.state != 'Z' {
			ticks += st.ticks
			n++
		}
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("peer: process group %d has no live process", pgid)
	}
	return time.Duration(ticks) * tick, n, nil
}

// stat is what GroupCPU reads of one /proc/PID/stat.
type stat struct {
	state byte
	pgrp  int
	ticks int64 // utime + stime + cutime + cstime
}

// parseStat reads /proc/PID/stat's text. The command name, field 2, is in parentheses and
// may hold spaces, newlines and parentheses itself, so fields are counted from the last
// ')': field 3 is the state, 5 the process group, 14 to 17 utime, stime, cutime and cstime.
func parseStat(b []byte) (stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, errors.New("no command name in stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 15 {
		return stat{}, fmt.Errorf("stat has %d fields after the command name, want at least 15", len(f))
	}
	if len(f[0]) != 1 {
		return stat{}, fmt.Errorf("state %q: want one letter", f[0])
	}
	s := stat{state: f[0][0]}
	var err error
	if s.pgrp, err = strconv.Atoi(string(f[2])); err != nil {
		return stat{}, fmt.Errorf("pgrp: %w", err)
	}
	for _, field := range f[11:15] {
		t, err := strconv.ParseInt(string(field), 10, 64)
		if err != nil || t < 0 {
			return stat{}, fmt.Errorf("cpu time %q: want a count of ticks", field)
		}
		s.ticks += t
	}
	return s, nil
}

// Quiet is when Settle calls a meter quiet: it grew by at most Idle of one CPU over each
// of Windows consecutive windows of Window. Settle gives up after Max (it may run one
// window past it).
type Quiet struct {
	Window  time.Duration
	Idle    float64
	Windows int
	Max     time.Duration
}

// DefaultQuiet: at most a tenth of a CPU in each of two windows of 200 ms in a row (two of
// /proc's 10 ms ticks), waiting at most 20 s.
var DefaultQuiet = Quiet{Window: 200 * time.Millisecond, Idle: 0.1, Windows: 2, Max: 20 * time.Second}

// minWindow is the shortest window Settle takes: ten of /proc's ticks, so that a tenth of
// a CPU is at least one tick.
const minWindow = 10 * tick

func (q Quiet) check() error {
	switch {
	case q.Window < minWindow:
		return fmt.Errorf("peer: quiet.Window = %v: want at least %v (/proc counts CPU in %v ticks)", q.Window, minWindow, tick)
	case math.IsNaN(q.Idle) || q.Idle < 0 || q.Idle > float64(runtime.NumCPU()):
		return fmt.Errorf("peer: quiet.Idle = %v: want a share of one CPU from 0 to %d (the CPUs)", q.Idle, runtime.NumCPU())
	case q.Windows < 1:
		return fmt.Errorf("peer: quiet.Windows = %d: want at least 1", q.Windows)
	case q.Max < time.Duration(q.Windows)*q.Window:
		return fmt.Errorf("peer: quiet.Max = %v: want at least Windows × Window = %v, or quiet can never be seen", q.Max, time.Duration(q.Windows)*q.Window)
	}
	return nil
}

// Settled is how a Settle went: how long it waited, the CPU the meter grew by meanwhile,
// and whether it went quiet (false: it gave up at Max).
type Settled struct {
	Waited, CPU time.Duration
	Quiet       bool
}

// Settle waits until m is quiet by q. A meter that fails (a group with no live process
// left, say) is an error; so is ctx ending, and a q that cannot be met (its error names the
// field). A window is judged on the time that actually passed, so a late sample is not a
// short window.
func Settle(ctx context.Context, m Meter, q Quiet) (Settled, error) {
	if err := q.check(); err != nil {
		return Settled{}, err
	}
	start := time.Now()
	first, err := m()
	if err != nil {
		return Settled{}, err
	}
	prev, prevAt, calm := first, start, 0
	for {
		t := time.NewTimer(q.Window)
		select {
		case <-ctx.Done():
			t.Stop()
			return Settled{}, ctx.Err()
		case <-t.C:
		}
		cur, err := m()
		if err != nil {
			return Settled{}, err
		}
		now := time.Now()
		// A meter that went down lost a process (its CPU left with it): not calm.
		if used := cur - prev; used >= 0 && float64(used) <= q.Idle*float64(now.Sub(prevAt)) {
			calm++
		} else {
			calm = 0
		}
		prev, prevAt = cur, now
		s := Settled{Waited: now.Sub(start), CPU: max(cur-first, 0), Quiet: calm >= q.Windows}
		if s.Quiet || s.Waited >= q.Max {
			return s, nil
		}
	}
}

// SettleLog sums up the Settles of a run, for its report.
type SettleLog struct {
	rule Quiet // what Wait waits for

	// The rule every phase waited for (NewSettleLog), as the report gives it.
	IdleShare float64 `json:"idle_share"`
	WindowMs  float64 `json:"window_ms"`
	Windows   int     `json:"windows"`
	MaxWaitMs float64 `json:"max_wait_ms"`

	Phases int `json:"phases"`
	// NotQuiet counts the phases that started after MaxWaitMs without quiet.
	NotQuiet  int     `json:"not_quiet"`
	WaitedMs  float64 `json:"waited_ms_total"`
	LongestMs float64 `json:"waited_ms_longest"`
	// CPUMs is the CPU used while Settle waited: work left over from the phase before,
	// that no figure's CPU per job counts.
	CPUMs float64 `json:"cpu_ms_while_waiting"`
}

// NewSettleLog is the log of a run whose phases wait for q.
func NewSettleLog(q Quiet) SettleLog {
	return SettleLog{rule: q, IdleShare: q.Idle, WindowMs: Ms(q.Window), Windows: q.Windows, MaxWaitMs: Ms(q.Max)}
}

// Wait settles m by the log's rule (Settle) and records the wait.
func (l *SettleLog) Wait(ctx context.Context, m Meter) error {
	s, err := Settle(ctx, m, l.rule)
	if err != nil {
		return err
	}
	l.Add(s)
	return nil
}

// Waiter is a peer bench's step before each measured phase: wait by the log's rule for
// the peer's server (process group pgid) and this process to go quiet. A failure names
// server and carries out, the server's output so far.
func (l *SettleLog) Waiter(ctx context.Context, pgid int, server string, out *Tail) func() error {
	m := Sum(Group(pgid), Self())
	return func() error {
		if err := l.Wait(ctx, m); err != nil {
			return fmt.Errorf("wait for %s and this process to go quiet: %w; its output: %s", server, err, out.String())
		}
		return nil
	}
}

// Add records one Settle.
func (l *SettleLog) Add(s Settled) {
	l.Phases++
	if !s.Quiet {
		l.NotQuiet++
	}
	w := Ms(s.Waited)
	l.WaitedMs = Round2(l.WaitedMs + w)
	l.LongestMs = Round2(max(l.LongestMs, w))
	l.CPUMs = Round2(l.CPUMs + Ms(s.CPU))
}

// Describe is the log as a report's note says it; what names what was waited for.
func (l SettleLog) Describe(what string) string {
	return fmt.Sprintf("before each of %d measured phases %s went quiet (at most %g of a CPU in each of %d windows of %g ms in a row; %d phases gave up after %g ms): waits %.0f ms in all, %.0f ms the longest, with %.0f ms of CPU used meanwhile",
		l.Phases, what, l.IdleShare, l.Windows, l.WindowMs, l.NotQuiet, l.MaxWaitMs, l.WaitedMs, l.LongestMs, l.CPUMs)
}
