package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/stack"
)

// syncBuffer is a bytes.Buffer safe to write from up and read from the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startUp runs `handoff up` with args on loopback ports until the test ends and returns
// what it printed once it is serving.
func startUp(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs syncBuffer
	done := make(chan int, 1)
	args = append([]string{"--data", t.TempDir(), "--coordinator-listen", "127.0.0.1:0", "--agentrunner-listen", "127.0.0.1:0",
		"--writeback-listen", "127.0.0.1:0", "--web-listen", "127.0.0.1:0", "--metrics-listen", ""}, args...)
	go func() { done <- up(ctx, args, &out, &errs) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "Ctrl-C") {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("handoff up %v ended with %d: %s%s", args, code, out.String(), errs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("handoff up did not start: %s%s", out.String(), errs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out.String()
}

func field(t *testing.T, out, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %s in:\n%s", re, out)
	}
	return m[1]
}

// `handoff up --pipelines DIR` runs the pipelines of DIR (so a stage can name another
// runner, e.g. the TypeScript one), not the shipped ones; a bad DIR stops it naming the flag.
func TestUpPipelines(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "pipelines", "support-ticket.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mine.yaml"), bytes.Replace(data, []byte("name: support-ticket"), []byte("name: my-ticket"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out := startUp(t, "--pipelines", dir, "--operator-token", "up-test-operator-token-0123")
	cc, err := grpc.NewClient(field(t, out, `coordinator\s+(\S+)`), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := handoffv1.NewCoordinatorServiceClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer up-test-operator-token-0123")
	req := &handoffv1.SubmitJobRequest{JobId: "tkt_1", Pipeline: "my-ticket", Goal: "g", Budget: &handoffv1.Budget{UsdRemainingMicros: 1000}}
	if _, err := c.SubmitJob(ctx, req); err != nil {
		t.Fatalf("submit to the folder's pipeline: %v", err)
	}
	req.JobId, req.Pipeline = "tkt_2", "support-ticket"
	if _, err := c.SubmitJob(ctx, req); err == nil || !strings.Contains(err.Error(), "support-ticket") {
		t.Fatalf("submit to a shipped pipeline not in the folder: %v; want it refused naming it", err)
	}
	var errs bytes.Buffer
	if code := up(context.Background(), []string{"--pipelines", filepath.Join(dir, "nope")}, &bytes.Buffer{}, &errs); code != 2 || !strings.Contains(errs.String(), "--pipelines") {
		t.Fatalf("up --pipelines of no folder = %d %q; want 2 naming --pipelines", code, errs.String())
	}
}

// `--operator-token ""` makes a token for the run and prints it, as its help says, even
// with HANDOFF_OPERATOR_TOKEN set.
func TestUpEmptyOperatorTokenMakesOne(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", "token-from-the-environment-0123")
	out := startUp(t, "--operator-token", "")
	if tok := field(t, out, `operator token (\S+) \(made for this run`); len(tok) < 16 || strings.Contains(out, "token-from-the-environment") {
		t.Fatalf("up --operator-token \"\" printed:\n%s\nwant a token made for the run", out)
	}
}

// up and demo share the --otel-genai setting: off by default, on from the flag or
// HANDOFF_OTEL_GENAI, and it reaches the stack's config; a bad value is refused naming it.
func TestStackOtelGenAI(t *testing.T) {
	parse := func(args ...string) (stack.Config, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f stackFlags
		b := config.New(fs)
		bindStack(b, &f, "d", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "")
		err := b.Parse(args)
		return f.config(io.Discard), err
	}
	if cfg, err := parse(); err != nil || cfg.GenAISpans {
		t.Fatalf("default: GenAISpans %v (%v), want off", cfg.GenAISpans, err)
	}
	if cfg, err := parse("--otel-genai"); err != nil || !cfg.GenAISpans {
		t.Fatalf("--otel-genai: GenAISpans %v (%v), want on", cfg.GenAISpans, err)
	}
	t.Setenv("HANDOFF_OTEL_GENAI", "1")
	if cfg, err := parse(); err != nil || !cfg.GenAISpans {
		t.Fatalf("HANDOFF_OTEL_GENAI=1: GenAISpans %v (%v), want on", cfg.GenAISpans, err)
	}
	t.Setenv("HANDOFF_OTEL_GENAI", "yes please")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "HANDOFF_OTEL_GENAI") {
		t.Fatalf("HANDOFF_OTEL_GENAI=yes please: %v, want an error naming it", err)
	}
}

// The test-only --test-agentrunner-via and --test-writeback-via (for `handoff chaos
// --store bbolt`'s hop proxy) are left out of --help; a bad address is refused naming the
// flag; and the coordinator dials the runner at the given address, not its own listener.
func TestUpTestOnlyVia(t *testing.T) {
	allowTestVia(t)
	var out, errs bytes.Buffer
	if code := up(context.Background(), []string{"--help"}, &out, &errs); code != 0 || strings.Contains(out.String()+errs.String(), "-via") || !strings.Contains(errs.String(), "--data") && !strings.Contains(errs.String(), "-data") {
		t.Fatalf("up --help = %d, printed %q; want the flags without the test-only -via ones", code, out.String()+errs.String())
	}
	for _, c := range []struct{ flag, value string }{
		{"--test-agentrunner-via", "no-port"},
		{"--test-writeback-via", "127.0.0.1:99999"},
	} {
		errs.Reset()
		if code := up(context.Background(), []string{c.flag, c.value, "--data", t.TempDir()}, &bytes.Buffer{}, &errs); code != 2 || !strings.Contains(errs.String(), c.flag+` "`+c.value+`"`) {
			t.Errorf("up %s %s = %d %q; want 2 naming the flag and the value", c.flag, c.value, code, errs.String())
		}
	}

	// A TCP relay stands where the coordinator is told to dial, forwarding to the runner's
	// own listener (a port chosen here); it counts the connections it relays.
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runnerAddr := pl.Addr().String()
	pl.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case dialed <- struct{}{}:
			default:
			}
			go func() {
				defer c.Close()
				r, err := net.Dial("tcp", runnerAddr)
				if err != nil {
					return
				}
				defer r.Close()
				go io.Copy(r, c)
				io.Copy(c, r)
			}()
		}
	}()
	const tok = "up-test-operator-token-0123"
	up := startUp(t, "--agentrunner-listen", runnerAddr, "--test-agentrunner-via", l.Addr().String(), "--operator-token", tok)
	cc, err := grpc.NewClient(field(t, up, `coordinator\s+(\S+)`), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	req := &handoffv1.SubmitJobRequest{JobId: "tkt_via", Pipeline: "support-ticket", Goal: "g", Budget: &handoffv1.Budget{UsdRemainingMicros: 1000}}
	c := handoffv1.NewCoordinatorServiceClient(cc)
	resp, err := c.SubmitJob(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-dialed:
	case <-time.After(15 * time.Second):
		t.Fatal("the coordinator never dialed --test-agentrunner-via's address for the job's first stage")
	}
	// Through the relay the runner answers as if dialed directly: the job leaves its first
	// stage.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		j, err := c.GetJob(ctx, &handoffv1.GetJobRequest{RunId: resp.GetJob().GetRunId()})
		if err == nil && (j.GetJob().GetHops() > 0 || j.GetJob().GetState() != handoffv1.JobState_JOB_STATE_RUNNING) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job made no hop through the relay: %v %v", j, err)
		}
	}
}

// The test-only -via flags send the coordinator's calls, with its signed service tokens
// (bearer tokens good for 5 minutes at the agent runner and the writeback, no replay
// check) and the handoff packages, in plaintext to the address given. They are for a
// proxy on this machine only: an address off loopback, or one that cannot be dialed
// (port 0), is refused naming the flag and the value, before anything starts.
func TestUpTestViaLoopbackOnly(t *testing.T) {
	allowTestVia(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a value that is (wrongly) accepted starts the stack and stops at once
	for _, flagName := range []string{"--test-agentrunner-via", "--test-writeback-via"} {
		for _, v := range []string{"203.0.113.7:50051", "example.com:443", "[2001:db8::1]:50051", "0.0.0.0:50051", "127.0.0.1:0"} {
			var errs bytes.Buffer
			args := []string{flagName, v, "--data", t.TempDir(), "--coordinator-listen", "127.0.0.1:0", "--agentrunner-listen", "127.0.0.1:0",
				"--writeback-listen", "127.0.0.1:0", "--web-listen", "", "--metrics-listen", ""}
			if code := up(ctx, args, &bytes.Buffer{}, &errs); code != 2 || !strings.Contains(errs.String(), flagName+` "`+v+`"`) {
				t.Errorf("up %s %s = %d %q; want 2 naming the flag and the value (loopback only)", flagName, v, code, errs.String())
			}
		}
	}
}

// The test-only -via flags are refused by a handoff built for release (without -tags
// crashpoints, which `handoff chaos` builds with): hidden from --help is not enough for
// flags that send the coordinator's tokens elsewhere. Only tests and chaos builds have them.
func TestUpTestViaRefusedInReleaseBuild(t *testing.T) {
	if crashpoint.Enabled {
		t.Skip("a -tags crashpoints build has the test-only flags")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, flagName := range []string{"--test-agentrunner-via", "--test-writeback-via"} {
		var errs bytes.Buffer
		args := []string{flagName, "127.0.0.1:1", "--data", t.TempDir(), "--coordinator-listen", "127.0.0.1:0", "--agentrunner-listen", "127.0.0.1:0",
			"--writeback-listen", "127.0.0.1:0", "--web-listen", "", "--metrics-listen", ""}
		if code := up(ctx, args, &bytes.Buffer{}, &errs); code != 2 || !strings.Contains(errs.String(), flagName) || !strings.Contains(errs.String(), "crashpoints") {
			t.Errorf("up %s in a release build = %d %q; want 2 naming the flag and the build it needs", flagName, code, errs.String())
		}
	}
}

// allowTestVia lets this test use the test-only flags, as a -tags crashpoints build does.
func allowTestVia(t *testing.T) {
	defer func(v bool) { t.Cleanup(func() { testViaAllowed = v }) }(testViaAllowed)
	testViaAllowed = true
}
