package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// crashPendingTTL is the writeback's --pending-ttl here: short, so a claim whose writer was
// killed lapses soon, yet long enough to outlast the restart on a busy machine (the retry
// must find the dead writer's claim still pending).
const crashPendingTTL = 2 * time.Second

// TestCrashBetweenClaimAndReceipt is issue 14's double write, for real: the writeback binary,
// built with crash points, is SIGKILLed at each point between its claim of a key and the
// answer that carries the receipt, started again on the same store, and the write is
// retried as the coordinator retries it (Aborted while the dead writer's claim is pending,
// then again). Whatever the point, the ledger ends with exactly one entry for the key,
// offered once, and the receipt stored for the key is the answer and names that entry.
// On Redis and on a bbolt file (which the killed process held locked, and the next opens).
func TestCrashBetweenClaimAndReceipt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the writeback with -tags crashpoints and kills it 8 times; skipped with -short")
	}
	bin := buildCrashBinary(t)
	certsDir := t.TempDir()
	if err := certs.Generate(certsDir, []string{"writeback", "coordinator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	stores := []struct {
		name string
		// releasedAtOpen: the store frees a dead writer's pending claim when the restarted
		// process opens it (bbolt: the killed process held the file's exclusive lock, so no
		// live writer can hold the claim; store/bolt_reclaim.go). Elsewhere the claim holds
		// until it lapses, and the retry is told the key is in flight meanwhile.
		releasedAtOpen bool
		open           func(t *testing.T) (url string, inspect func(t *testing.T) (store.Store, func()))
	}{
		{"redis", false, func(t *testing.T) (string, func(*testing.T) (store.Store, func())) {
			prefix := storetest.RedisPrefix(t)
			u := "redis://" + storetest.RedisAddr() + "/0?prefix=" + url.QueryEscape(prefix)
			return u, func(t *testing.T) (store.Store, func()) { return storetest.OpenRedisPrefix(t, prefix), func() {} }
		}},
		{"bbolt", true, func(t *testing.T) (string, func(*testing.T) (store.Store, func())) {
			path := filepath.Join(t.TempDir(), "writeback.db")
			return path, func(t *testing.T) (store.Store, func()) {
				st, err := store.Open(path) // the process is stopped: the file is free
				if err != nil {
					t.Fatal(err)
				}
				return st, func() { st.Close() }
			}
		}},
	}
	for _, sc := range stores {
		for _, point := range crashpoint.Points {
			t.Run(sc.name+"/"+point, func(t *testing.T) {
				storeURL, inspect := sc.open(t)
				testCrashAt(t, bin, certsDir, storeURL, point, sc.releasedAtOpen, inspect)
			})
		}
	}
}

func testCrashAt(t *testing.T, bin, certsDir, storeURL, point string, releasedAtOpen bool, inspect func(*testing.T) (store.Store, func())) {
	dir := t.TempDir()
	files, err := artifact.NewFiles(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	const jobID = "tkt-crash"
	art, err := files.Put(context.Background(), artifact.Ref{JobID: jobID, Stage: "draft", Round: 1, Type: "reply_md",
		SchemaVersion: "reply_md.v1", MediaType: "text/markdown"}, []byte("# Reply\n\nYour refund was issued.\n"))
	if err != nil {
		t.Fatal(err)
	}
	key := jobID + ":writeback:reply_md"
	req := &handoffv1.WriteRequest{
		Package: &handoffv1.HandoffPackage{
			Schema: "handoff.v1", JobId: jobID, Stage: "writeback", Goal: "Answer the customer",
			Artifacts: []*handoffv1.Artifact{art},
			Evaluator: &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: 1},
			Budget:    &handoffv1.Budget{UsdRemainingMicros: 1000, RevisionsRemaining: 1, HopsRemaining: 1},
		},
		Artifact: proto.Clone(art).(*handoffv1.Artifact),
		Target:   "ledger",
	}

	wb := &crashProc{t: t, bin: bin, addr: freeAddr(t), certs: certsDir, log: filepath.Join(dir, "writeback.log"), killAt: point}
	hook, stopHook, err := crashpoint.Serve(wb.visit)
	if err != nil {
		t.Fatal(err)
	}
	defer stopHook()
	wb.args = []string{"--listen", wb.addr, "--store", storeURL, "--artifacts", files.Root(), "--certs", certsDir,
		"--pending-ttl", crashPendingTTL.String()}
	wb.env = append(os.Environ(), crashpoint.HookEnv+"="+hook)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wb.start(ctx)
	_, err = wb.client().Write(ctx, req)
	if !wb.killed() {
		t.Fatalf("the write passed %v without reaching %s (answer: %v)\n%s", wb.passed(), point, err, wb.logTail())
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write answered %v while the writeback was killed at %s; want Unavailable", err, point)
	}
	wb.wait()
	first := wb.passed()

	wb.start(ctx) // the same store, the crash points still reported but no longer killed at
	resp, aborts, err := retryWrite(ctx, wb.client(), req)
	if err != nil {
		t.Fatalf("retry after the crash at %s: %v\n%s", point, err, wb.logTail())
	}
	retry := wb.passed()
	wb.stop()

	// A crash before the receipt is stored leaves nothing (the claim lapses, or on bbolt is
	// released at open, and the retry writes); from the point where entry and receipt are
	// stored on, the retry is answered with that receipt and writes nothing.
	stored := slices.Index(crashpoint.Points, point) >= slices.Index(crashpoint.Points, crashpoint.AfterWrite)
	if resp.GetDuplicate() != stored {
		t.Errorf("retry answered duplicate=%v; want %v after a crash at %s", resp.GetDuplicate(), stored, point)
	}
	wantRetry := crashpoint.Points // the whole write, again
	if stored {
		wantRetry = nil
	}
	if !slices.Equal(retry, wantRetry) {
		t.Errorf("the retry passed %v; want %v", retry, wantRetry)
	}
	switch {
	case !stored && !releasedAtOpen && aborts == 0:
		t.Errorf("the retry was never told the dead writer's key was in flight; the claim did not hold")
	case releasedAtOpen && aborts != 0:
		t.Errorf("the retry was told %d times the dead writer's key was in flight; the claim should have been released when the restarted writeback opened the file", aborts)
	}
	t.Logf("killed at %s after passing %v; the retry (after %d Aborted) passed %v, answered duplicate=%v",
		point, first, aborts, retry, resp.GetDuplicate())

	st, closeStore := inspect(t)
	defer closeStore()
	entries, err := st.LedgerEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mine []store.LedgerEntry
	for _, e := range entries {
		if e.Key == key {
			mine = append(mine, e)
		}
	}
	if len(mine) != 1 || mine[0].Offers != 1 {
		t.Fatalf("ledger has %+v for %s; want exactly one entry, offered once", mine, key)
	}
	if got := resp.GetReceipt().GetExternalId(); got != mine[0].ID {
		t.Errorf("receipt names %s; want the key's entry %s", got, mine[0].ID)
	}
	state, v, err := st.Lookup(ctx, key)
	rec := &handoffv1.WriteResponse{}
	if err != nil || state != store.Done || proto.Unmarshal(v, rec) != nil || !proto.Equal(rec.GetReceipt(), resp.GetReceipt()) {
		t.Errorf("stored receipt %v %v (%v); want done with the answer's %v", state, rec, err, resp.GetReceipt())
	}
}

// buildCrashBinary builds this command with -tags crashpoints into a temporary folder.
func buildCrashBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "writeback")
	out, err := exec.Command("go", "build", "-tags", "crashpoints", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -tags crashpoints: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// crashProc is the writeback process under test: started, killed by its crash-point hook
// at killAt the first time a write passes it, started again.
type crashProc struct {
	t                *testing.T
	bin, addr, certs string
	args, env        []string
	log              string
	killAt           string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	points []string // passed since the last start
	kills  int
}

// visit is the crash-point hook: it SIGKILLs the process at killAt, once, and returns only
// when it is dead, so the point's next step never runs.
func (p *crashProc) visit(v crashpoint.Visit) {
	p.mu.Lock()
	p.points = append(p.points, v.Point)
	kill := v.Point == p.killAt && p.kills == 0 && p.cmd != nil && v.PID == p.cmd.Process.Pid
	if kill {
		p.kills++
	}
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if kill {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

func (p *crashProc) killed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kills > 0
}

func (p *crashProc) passed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.points)
}

// start runs the binary and waits until its health answers SERVING.
func (p *crashProc) start(ctx context.Context) {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = p.env, f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(exited) }()
	p.t.Cleanup(func() { // whatever happened, no process outlives the test
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	})
	p.mu.Lock()
	p.cmd, p.exited, p.points = cmd, exited, nil
	p.mu.Unlock()
	hc := healthpb.NewHealthClient(p.dial())
	for {
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-exited:
			p.t.Fatalf("writeback exited at start:\n%s", p.logTail())
		case <-ctx.Done():
			p.t.Fatalf("writeback not SERVING: %v\n%s", err, p.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dial connects to the process as the coordinator (mTLS), on a new connection: an old one
// may be backing off from the killed process.
func (p *crashProc) dial() *grpc.ClientConn {
	p.t.Helper()
	tc, err := certs.ClientTLS(p.certs, "coordinator")
	if err != nil {
		p.t.Fatal(err)
	}
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		// Retry a refused dial quickly (a process starting): the default backoff waits 1s,
		// as long as the pending TTL the claim must still hold at the retry.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return conn
}

// client is a WritebackService client on a new connection (dial).
func (p *crashProc) client() handoffv1.WritebackServiceClient {
	return handoffv1.NewWritebackServiceClient(p.dial())
}

// wait waits for the killed process to be gone.
func (p *crashProc) wait() {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	<-exited
}

// stop ends the process with SIGTERM (a graceful stop) and waits for it.
func (p *crashProc) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		p.t.Errorf("writeback did not stop within 30s of SIGTERM")
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

func (p *crashProc) logTail() string {
	f, err := os.Open(p.log)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// retryWrite is the coordinator's retry: Aborted (in flight) waits its RetryInfo delay and
// tries again, Unavailable (the process is still coming up) a moment; anything else ends it.
func retryWrite(ctx context.Context, c handoffv1.WritebackServiceClient, req *handoffv1.WriteRequest) (*handoffv1.WriteResponse, int, error) {
	aborts := 0
	for {
		resp, err := c.Write(ctx, req)
		delay := 50 * time.Millisecond
		switch status.Code(err) {
		case codes.OK:
			return resp, aborts, nil
		case codes.Aborted:
			aborts++
			for _, d := range status.Convert(err).Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					delay = min(ri.GetRetryDelay().AsDuration(), 200*time.Millisecond)
				}
			}
		case codes.Unavailable:
		default:
			return nil, aborts, err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, aborts, errors.Join(fmt.Errorf("no answer before the deadline (last: %v)", err), ctx.Err())
		}
	}
}
