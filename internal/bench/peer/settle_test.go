package peer

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		name, stat string
		pgrp       int
		ticks      int64
		err        string
	}{
		{"plain", "812 (restate-server) S 800 800 800 0 -1 4194560 1 0 0 0 150 25 0 0 20 0 9 0", 800, 175, ""},
		{"name with spaces and parens", "9 (a) b (c)) R 1 42 42 0 -1 0 0 0 0 0 7 3 0", 42, 10, ""},
		{"no name", "812 restate S 800", 0, 0, "no command name"},
		{"cut short", "812 (x) S 800 800 800 0 -1 0 0 0 0 0 150", 0, 0, "want at least 13"},
		{"bad group", "812 (x) S 800 abc 800 0 -1 0 0 0 0 0 150 25", 0, 0, "pgrp"},
		{"bad cpu time", "812 (x) S 800 800 800 0 -1 0 0 0 0 0 1x0 25", 0, 0, "cpu time"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pgrp, ticks, err := parseStat([]byte(c.stat))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil || pgrp != c.pgrp || ticks != c.ticks {
				t.Fatalf("= %d, %d, %v; want %d, %d", pgrp, ticks, err, c.pgrp, c.ticks)
			}
		})
	}
}

// group starts a shell running script in a process group of its own and returns the
// group's id; the group is killed when the test ends.
func group(t *testing.T, script string) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd.Process.Pid
}

func TestGroupCPU(t *testing.T) {
	busy := group(t, "while :; do :; done")
	idle := group(t, "sleep 60")
	time.Sleep(500 * time.Millisecond)
	cpu, n, err := GroupCPU(busy)
	// Loose bounds: other packages' tests share the CPUs.
	if err != nil || n != 1 || cpu < 50*time.Millisecond {
		t.Fatalf("spinning group: %v over %d processes, %v; want >= 50ms of CPU in 500ms, one process", cpu, n, err)
	}
	// sh may run sleep in a child: the group holds one process or two.
	if cpu, n, err := GroupCPU(idle); err != nil || n < 1 || cpu > 50*time.Millisecond {
		t.Fatalf("sleeping group: %v over %d processes, %v; want about none", cpu, n, err)
	}
	if _, _, err := GroupCPU(0); err == nil || !strings.Contains(err.Error(), "process group 0") {
		t.Fatalf("group 0: err = %v, want one naming it", err)
	}
	// A finished group has no process left: nothing to measure is an error, not a quiet 0.
	done := exec.Command("true")
	done.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := GroupCPU(done.Process.Pid); err == nil || !strings.Contains(err.Error(), "has no process") {
		t.Fatalf("finished group: err = %v, want 'has no process'", err)
	}
}

func TestSettle(t *testing.T) {
	q := Quiet{Window: 100 * time.Millisecond, Idle: 0.1, Windows: 2, Max: 5 * time.Second}
	ctx := context.Background()

	s, err := Settle(ctx, group(t, "sleep 60"), q)
	if err != nil || !s.Quiet || s.Waited < 200*time.Millisecond || s.Waited >= q.Max {
		t.Fatalf("idle group: %+v, %v; want quiet after two windows, before max", s, err)
	}

	short := q
	short.Max = 700 * time.Millisecond
	s, err = Settle(ctx, group(t, "while :; do :; done"), short)
	if err != nil || s.Quiet || s.Waited < short.Max || s.CPU < 100*time.Millisecond {
		t.Fatalf("spinning group: %+v, %v; want not quiet, given up at max, its CPU counted", s, err)
	}

	// Busy, then quiet: the wait ends once the work does, and counts it. (The loop is the
	// shell's own: a short-lived child's CPU leaves the group's live processes with it.)
	s, err = Settle(ctx, group(t, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 60"), q)
	if err != nil || !s.Quiet || s.CPU < 100*time.Millisecond {
		t.Fatalf("busy-then-idle group: %+v, %v; want quiet, with the busy part's CPU", s, err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Settle(cancelled, group(t, "sleep 60"), q); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
	if _, err := Settle(ctx, group(t, "sleep 60"), Quiet{Window: 0, Idle: 0.1, Windows: 2, Max: time.Second}); err == nil || !strings.Contains(err.Error(), "positive window") {
		t.Fatalf("zero window: err = %v", err)
	}
}

func TestSettleLog(t *testing.T) {
	var l SettleLog
	l.Add(Settled{Waited: 400 * time.Millisecond, CPU: 30 * time.Millisecond, Quiet: true})
	l.Add(Settled{Waited: 1500 * time.Millisecond, CPU: 900 * time.Millisecond, Quiet: true})
	l.Add(Settled{Waited: 20 * time.Second, CPU: 5 * time.Second, Quiet: false})
	want := SettleLog{Phases: 3, NotQuiet: 1, WaitedMs: 21900, MaxMs: 20000, PeerCPUMs: 5930}
	if l != want {
		t.Fatalf("log = %+v, want %+v", l, want)
	}
	if s := l.String(); !strings.Contains(s, "3 measured phases") || !strings.Contains(s, "1 phases gave up") || !strings.Contains(s, "5930 ms of CPU") {
		t.Fatalf("String() = %q", s)
	}
}
