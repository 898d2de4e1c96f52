//go:build linux

package peer

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		name, stat string
		want       stat
		err        string
	}{
		{"plain", "812 (restate-server) S 800 800 800 0 -1 4194560 1 0 0 0 150 25 4 1 20 0 9 0", stat{'S', 800, 180}, ""},
		{"name with spaces, newline and parens", "9 (a) b\n(c)) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 0", stat{'R', 42, 10}, ""},
		{"zombie", "9 (x) Z 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 0", stat{'Z', 42, 10}, ""},
		{"no name", "812 restate S 800", stat{}, "no command name"},
		{"cut short", "812 (x) S 800 800 800 0 -1 0 0 0 0 0 150 25", stat{}, "want at least 15"},
		{"bad state", "812 (x) SS 800 800 800 0 -1 0 0 0 0 0 150 25 0 0", stat{}, "want one letter"},
		{"bad group", "812 (x) S 800 abc 800 0 -1 0 0 0 0 0 150 25 0 0", stat{}, "pgrp"},
		{"bad cpu time", "812 (x) S 800 800 800 0 -1 0 0 0 0 0 1x0 25 0 0", stat{}, `cpu time "1x0"`},
		{"negative cpu time", "812 (x) S 800 800 800 0 -1 0 0 0 0 0 150 -25 0 0", stat{}, `cpu time "-25"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseStat([]byte(c.stat))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("= %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// The test binary is also the workload of the tests below: with childEnv set it spins,
// sleeps or both, as told, and never runs a test.
const childEnv = "PEER_SETTLE_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "spin":
		spin(time.Hour)
	case "spin-then-sleep":
		spin(300 * time.Millisecond)
		time.Sleep(time.Hour)
	case "spin-briefly":
		spin(100 * time.Millisecond)
	}
	os.Exit(0)
}

// spin burns this process's CPU until it has used d of it.
func spin(d time.Duration) {
	for {
		cpu, err := Self()()
		if err != nil || cpu >= d {
			return
		}
		for i := 0; i < 1e6; i++ {
			_ = math.Sqrt(float64(i))
		}
	}
}

// group starts, in a process group of its own, the shell script script, in which $CHILD
// runs this test binary as the workload named after it; it returns the group's id, and the
// group is killed (and its leader reaped) when the test ends.
func group(t *testing.T, script string) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "CHILD="+os.Args[0])
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

func run(workload string) string { return childEnv + "=" + workload + ` "$CHILD"` }

func TestGroupCPU(t *testing.T) {
	busy := group(t, "exec env "+run("spin"))
	idle := group(t, "sleep 60")
	time.Sleep(500 * time.Millisecond)
	// Loose bounds: other packages' tests share the CPUs.
	cpu, n, err := GroupCPU(busy)
	if err != nil || n != 1 || cpu < 50*time.Millisecond {
		t.Fatalf("spinning group: %v over %d processes, %v; want >= 50ms of CPU in 500ms, one process", cpu, n, err)
	}
	// sh may run sleep in a child: the group holds one live process or two.
	if cpu, n, err := GroupCPU(idle); err != nil || n < 1 || cpu > 50*time.Millisecond {
		t.Fatalf("sleeping group: %v over %d processes, %v; want about none", cpu, n, err)
	}
	if _, _, err := GroupCPU(0); err == nil || !strings.Contains(err.Error(), "process group 0") {
		t.Fatalf("group 0: err = %v, want one naming it", err)
	}

	// A group whose only process has died but is not reaped yet is no live group: a
	// zombie is not a quiet server.
	dead := exec.Command("true")
	dead.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // exited, not waited for
	_, _, err = GroupCPU(dead.Process.Pid)
	dead.Wait()
	if err == nil || !strings.Contains(err.Error(), "has no live process") {
		t.Fatalf("zombie group: err = %v, want 'has no live process'", err)
	}
	// Reaped, it is gone.
	if _, _, err := GroupCPU(dead.Process.Pid); err == nil || !strings.Contains(err.Error(), "has no live process") {
		t.Fatalf("finished group: err = %v, want 'has no live process'", err)
	}
}

func TestSettle(t *testing.T) {
	q := Quiet{Window: 100 * time.Millisecond, Idle: 0.1, Windows: 2, Max: 10 * time.Second}
	ctx := context.Background()

	s, err := Settle(ctx, Group(group(t, "sleep 60")), q)
	if err != nil || !s.Quiet || s.Waited < 200*time.Millisecond || s.Waited >= q.Max {
		t.Fatalf("idle group: %+v, %v; want quiet after two windows, before max", s, err)
	}

	short := q
	short.Max = 700 * time.Millisecond
	s, err = Settle(ctx, Group(group(t, "exec env "+run("spin"))), short)
	if err != nil || s.Quiet || s.Waited < short.Max || s.CPU < 50*time.Millisecond {
		t.Fatalf("spinning group: %+v, %v; want not quiet, given up at max, its CPU counted", s, err)
	}

	// Busy, then quiet: the wait ends once the work does, and counts it.
	s, err = Settle(ctx, Group(group(t, run("spin-then-sleep"))), q)
	if err != nil || !s.Quiet || s.CPU < 250*time.Millisecond {
		t.Fatalf("busy-then-idle group: %+v, %v; want quiet, with the 300ms of CPU the work took", s, err)
	}

	// Work done by short-lived children counts once they are waited for: a group that
	// spends its time in them is busy, not quiet.
	s, err = Settle(ctx, Group(group(t, strings.Repeat(run("spin-briefly")+"; ", 3)+"sleep 60")), q)
	if err != nil || !s.Quiet || s.CPU < 250*time.Millisecond {
		t.Fatalf("group of short-lived children: %+v, %v; want quiet only after their 300ms of CPU, counted", s, err)
	}

	// A server that dies while waited for is an error, not a quiet server.
	dying := group(t, "sleep 0.3")
	if _, err := Settle(ctx, Group(dying), Quiet{Window: 100 * time.Millisecond, Idle: 0, Windows: 8, Max: 2 * time.Second}); err == nil || !strings.Contains(err.Error(), "has no live process") {
		t.Fatalf("group that ends: err = %v, want 'has no live process'", err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Settle(cancelled, Group(group(t, "sleep 60")), q); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
}

func TestSettleRefusesRulesItCannotMeet(t *testing.T) {
	ok := DefaultQuiet
	for _, c := range []struct {
		name string
		edit func(*Quiet)
		want string
	}{
		{"window shorter than /proc can tell", func(q *Quiet) { q.Window = 20 * time.Millisecond }, "quiet.Window = 20ms"},
		{"negative idle", func(q *Quiet) { q.Idle = -0.1 }, "quiet.Idle = -0.1"},
		{"NaN idle", func(q *Quiet) { q.Idle = math.NaN() }, "quiet.Idle = NaN"},
		{"idle beyond the CPUs", func(q *Quiet) { q.Idle = 1e12 }, "quiet.Idle = 1e+12"},
		{"no windows", func(q *Quiet) { q.Windows = 0 }, "quiet.Windows = 0"},
		{"max shorter than the windows", func(q *Quiet) { q.Max = 300 * time.Millisecond }, "quiet.Max = 300ms"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := ok
			c.edit(&q)
			called := false
			_, err := Settle(context.Background(), func() (time.Duration, error) { called = true; return 0, nil }, q)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one naming %q", err, c.want)
			}
			if called {
				t.Fatal("the meter was read for a rule that cannot be met")
			}
		})
	}
}

func TestSettleLog(t *testing.T) {
	l := NewSettleLog(DefaultQuiet)
	l.Add(Settled{Waited: 400 * time.Millisecond, CPU: 30 * time.Millisecond, Quiet: true})
	l.Add(Settled{Waited: 1500 * time.Millisecond, CPU: 900 * time.Millisecond, Quiet: true})
	l.Add(Settled{Waited: 20 * time.Second, CPU: 5 * time.Second, Quiet: false})
	want := SettleLog{rule: DefaultQuiet, IdleShare: 0.1, WindowMs: 200, Windows: 2, MaxWaitMs: 20000,
		Phases: 3, NotQuiet: 1, WaitedMs: 21900, LongestMs: 20000, CPUMs: 5930}
	if l != want {
		t.Fatalf("log = %+v, want %+v", l, want)
	}
	s := l.Describe("the server")
	for _, part := range []string{"3 measured phases the server went quiet", "at most 0.1 of a CPU in each of 2 windows of 200 ms", "1 phases gave up after 20000 ms", "5930 ms of CPU"} {
		if !strings.Contains(s, part) {
			t.Fatalf("Describe = %q, want it to say %q", s, part)
		}
	}
}

// Wait holds to the rule the log was made with, and records what it waited.
func TestSettleLogWait(t *testing.T) {
	q := Quiet{Window: 100 * time.Millisecond, Idle: 0.1, Windows: 2, Max: 5 * time.Second}
	l := NewSettleLog(q)
	if err := l.Wait(context.Background(), Group(group(t, "sleep 60"))); err != nil {
		t.Fatal(err)
	}
	if l.Phases != 1 || l.NotQuiet != 0 || l.WaitedMs < 200 || l.WaitedMs >= 5000 {
		t.Fatalf("after one wait for an idle group: %+v", l)
	}
	bad := NewSettleLog(Quiet{Window: 20 * time.Millisecond, Idle: 0.1, Windows: 2, Max: time.Second})
	if err := bad.Wait(context.Background(), Self()); err == nil || !strings.Contains(err.Error(), "quiet.Window = 20ms") || bad.Phases != 0 {
		t.Fatalf("a rule that cannot be met: err = %v, log %+v", err, bad)
	}
}

// A bench's Waiter records each wait in the log; when the server is gone, its error names
// the server and carries the server's last output.
func TestSettleLogWaiter(t *testing.T) {
	l := NewSettleLog(Quiet{Window: 100 * time.Millisecond, Idle: 0.1, Windows: 2, Max: 5 * time.Second})
	var out Tail
	out.Write([]byte("listening on 127.0.0.1:9070\n"))
	settle := l.Waiter(context.Background(), group(t, "sleep 60"), "the idle server", &out)
	if err := settle(); err != nil || l.Phases != 1 || l.NotQuiet != 0 {
		t.Fatalf("idle server: err = %v, log %+v; want one quiet phase", err, l)
	}
	settle = l.Waiter(context.Background(), group(t, "sleep 0.3"), "the dying server", &out)
	time.Sleep(600 * time.Millisecond)
	err := settle()
	for _, part := range []string{"wait for the dying server and this process to go quiet", "has no live process", "its output: listening on 127.0.0.1:9070"} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Fatalf("dead server: err = %v, want it to say %q", err, part)
		}
	}
	if l.Phases != 1 {
		t.Fatalf("a failed wait was recorded: %+v", l)
	}
}
