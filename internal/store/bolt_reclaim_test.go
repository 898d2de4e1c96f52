package store

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// reclaimChildEnv makes the test binary the process that holds the leases and claims
// (TestReclaimChild), killed by TestOpenReleasesDeadHolders.
const reclaimChildEnv = "HANDOFF_TEST_RECLAIM_CHILD"

// TestReclaimChild is the dead process of TestOpenReleasesDeadHolders: it opens the file,
// takes a run lease and a pending claim for an hour, completes a third key, says so and
// waits to be killed. It does nothing in a normal run.
func TestReclaimChild(t *testing.T) {
	path := os.Getenv(reclaimChildEnv)
	if path == "" {
		return
	}
	ctx := context.Background()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.AcquireLease(ctx, "run:r1", "dead-replica", time.Hour); err != nil || !ok {
		t.Fatalf("AcquireLease = %v, %v", ok, err)
	}
	if st, _, _, err := s.Claim(ctx, "job1:writeback:summary", time.Hour); err != nil || st != Claimed {
		t.Fatalf("Claim = %v, %v", st, err)
	}
	_, _, owner, err := s.Claim(ctx, "job1:triage", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "job1:triage", owner, []byte("receipt"), 0); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("held\n")
	time.Sleep(time.Minute) // SIGKILLed long before
	t.Fatal("not killed")
}

// TestOpenReleasesDeadHolders: a lease and a pending claim left in the file by a process
// that was SIGKILLed (a real subprocess, holding them for an hour) are free as soon as the
// file is opened again, since the file's exclusive lock proves their holder gone; the
// completed record is kept, so a retry still gets the first answer.
func TestOpenReleasesDeadHolders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handoff.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestReclaimChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), reclaimChildEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "held" {
		t.Fatalf("child said %q, %v; want held", line, err)
	}
	cmd.Process.Kill()
	cmd.Wait()

	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if ok, err := s.AcquireLease(ctx, "run:r1", "new-replica", time.Minute); err != nil || !ok {
		t.Errorf("AcquireLease of the dead holder's run = %v, %v; want it free at open", ok, err)
	}
	if st, _, _, err := s.Claim(ctx, "job1:writeback:summary", time.Minute); err != nil || st != Claimed {
		t.Errorf("Claim of the dead holder's pending key = %v, %v; want Claimed", st, err)
	}
	if st, v, _, err := s.Claim(ctx, "job1:triage", time.Minute); err != nil || st != Done || string(v) != "receipt" {
		t.Errorf("Claim of the completed key = %v %q, %v; want Done with its receipt", st, v, err)
	}
}

// TestReclaimKeepsLiveHolders: within one open file the release happens only at Open: a
// lease and a pending claim taken after it hold against others as before.
func TestReclaimKeepsLiveHolders(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "handoff.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if ok, err := s.AcquireLease(ctx, "run:r1", "a", time.Minute); err != nil || !ok {
		t.Fatalf("AcquireLease = %v, %v", ok, err)
	}
	if ok, _ := s.AcquireLease(ctx, "run:r1", "b", time.Minute); ok {
		t.Error("a second owner took a live lease")
	}
	s.Claim(ctx, "k", time.Minute)
	if st, _, _, _ := s.Claim(ctx, "k", time.Minute); st != Pending {
		t.Errorf("second Claim = %v; want Pending", st)
	}
}

// TestSecondOpenInProcessReleasesNothing: the release at open rests on the file's lock
// keeping out every other opener while a holder lives, this process's own goroutines
// included (bbolt's flock is per open file, not per process). A second Open of a file
// this process has open waits for the lock, fails with ErrHeld, and releases nothing: the
// first opener's lease and pending claim still hold.
func TestSecondOpenInProcessReleasesNothing(t *testing.T) {
	first, path := openFirst(t)
	ctx := context.Background()
	if ok, err := first.AcquireLease(ctx, "run:r1", "live", time.Minute); err != nil || !ok {
		t.Fatalf("AcquireLease = %v, %v", ok, err)
	}
	if st, _, _, err := first.Claim(ctx, "job1:writeback:summary", time.Minute); err != nil || st != Claimed {
		t.Fatalf("Claim = %v, %v", st, err)
	}
	if second, err := Open(path); !errors.Is(err, ErrHeld) {
		if second != nil {
			second.Close()
		}
		t.Fatalf("second Open in this process = %v; want ErrHeld", err)
	}
	if ok, _ := first.AcquireLease(ctx, "run:r1", "other", time.Minute); ok {
		t.Error("the live lease was released by a second opener")
	}
	if st, _, _, _ := first.Claim(ctx, "job1:writeback:summary", time.Minute); st != Pending {
		t.Errorf("the live claim is %v after a second opener; want Pending", st)
	}
}
