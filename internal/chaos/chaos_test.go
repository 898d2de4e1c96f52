package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestShortChaosRun is the harness end to end, small: 20 jobs, two SIGKILLs of each service,
// one Redis restart, 5% of hops delivered twice. Every job must end and nothing may be
// written twice. It builds the three service binaries and needs redis-server: without it
// the test fails under CI and is skipped elsewhere.
func TestShortChaosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries and runs for about a minute; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server not found: apt-get install redis-server"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{
		Jobs: 20, Kills: 2, RedisRestarts: 1, Redeliver: 0.05, Concurrency: 20,
		Deadline: 3 * time.Minute, WorkDir: t.TempDir(), Progress: &progress, Seed: 7,
	})
	if errors.Is(err, ErrNoRedisServer) {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("%v\nprogress:\n%s", err, progress.String())
	}
	var text bytes.Buffer
	rep.WriteText(&text)
	t.Log("\n" + progress.String() + text.String())
	if len(rep.Violations) > 0 {
		t.Fatalf("violations: %v", rep.Violations)
	}
	if ended := rep.Jobs.Completed + rep.Jobs.Escalated + rep.Jobs.Failed; ended != 20 || rep.Jobs.Submitted != 20 {
		t.Fatalf("%d of %d submitted jobs ended; want 20 of 20", ended, rep.Jobs.Submitted)
	}
	for _, svc := range []string{"coordinator", "agentrunner", "writeback"} {
		if rep.Kills[svc] != 2 {
			t.Errorf("%s killed %d times, want 2", svc, rep.Kills[svc])
		}
	}
	if rep.RedisRestarts != 1 {
		t.Errorf("redis restarted %d times, want 1", rep.RedisRestarts)
	}
	// Each writeback kill lost the answer to a write the sink had applied; the retry sent it
	// again under the same key, and the sink absorbed it.
	if rep.Sink.ResentAbsorbed < rep.Kills["writeback"] || rep.Sink.KeysApplied < rep.Jobs.Completed {
		t.Errorf("sink: %d re-sent deliveries absorbed for %d writeback kills, %d keys for %d completed jobs",
			rep.Sink.ResentAbsorbed, rep.Kills["writeback"], rep.Sink.KeysApplied, rep.Jobs.Completed)
	}
	for name, how := range rep.Stops {
		if !strings.HasPrefix(how, "graceful") {
			t.Errorf("%s at SIGTERM: %s; want a graceful drain", name, how)
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Fatal(err)
	}
}
