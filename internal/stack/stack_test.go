package stack_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/internal/testkit"
)

// TestMetrics checks the Prometheus endpoint counts RPCs per method and acks per status.
func TestMetrics(t *testing.T) {
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.Dial(st.RunnerAddr)
	if err != nil {
		t.Fatal(err)
	}
	runner := handoffv1.NewAgentRunnerServiceClient(cc)
	bad := &handoffv1.CheckRequest{Package: &handoffv1.HandoffPackage{Schema: "handoff.v1", Stage: "draft"}}
	for range 2 {
		resp, err := runner.Check(context.Background(), bad)
		if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
			t.Fatalf("Check(bad) = %v, %v; want REJECTED_SCHEMA", resp, err)
		}
	}
	srv := httptest.NewServer(telemetry.Handler(st.Registry))
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`handoff_acks_total{grpc_method="Check",service="agentrunner",status="REJECTED_SCHEMA"} 2`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Check",grpc_service="handoff.v1.AgentRunnerService",grpc_type="unary",service="agentrunner"} 2`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Write",grpc_service="handoff.v1.WritebackService",grpc_type="unary",service="writeback"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// writeReq is a write the judge passed, of a summary stored in st's artifacts.
func writeReq(t *testing.T, st *stack.Stack, jobID string) *handoffv1.WriteRequest {
	t.Helper()
	art, err := st.Artifacts.Put(context.Background(), artifact.Ref{JobID: jobID, Stage: "draft", Type: "summary_md", SchemaVersion: "summary_md.v1", MediaType: "text/markdown"}, []byte("summary [hc-refund-policy]"))
	if err != nil {
		t.Fatal(err)
	}
	return &handoffv1.WriteRequest{
		Package: &handoffv1.HandoffPackage{
			Schema: "handoff.v1", JobId: jobID, Stage: "writeback", Goal: "g",
			Budget:    &handoffv1.Budget{UsdRemainingMicros: 1, HopsRemaining: 1},
			Evaluator: &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: 1},
			Artifacts: []*handoffv1.Artifact{art},
		},
		Artifact: art, Target: "ledger",
	}
}

// TestLedgerEnforcesTheKey is the double write under `+"`handoff up`"+`: a writeback
// that died after its ledger entry and before its receipt, whose claim then lapsed. The
// retry finds the key's entry instead of writing a second one (the stack's ledger used to
// append every write), and its receipt, stored with it, names that entry.
func TestLedgerEnforcesTheKey(t *testing.T) {
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const key = "tkt_9:writeback:summary_md"
	dead, _, err := st.Store.AppendLedger(ctx, key, []byte("summary [hc-refund-policy]"))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := st.DialAs(st.WritebackAddr, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := handoffv1.NewWritebackServiceClient(cc).Write(ctx, writeReq(t, st, "tkt_9"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetReceipt().GetExternalId() != dead.ID {
		t.Errorf("receipt names %s; want the entry the dead writer made, %s", resp.GetReceipt().GetExternalId(), dead.ID)
	}
	entries, err := st.Store.LedgerEntries(ctx)
	if err != nil || len(entries) != 1 || entries[0].Offers != 2 {
		t.Fatalf("ledger %+v, %v; want one entry for the key, offered twice", entries, err)
	}
	if state, _, err := st.Store.Lookup(ctx, key); err != nil || state != store.Done {
		t.Errorf("receipt record %v, %v; want done", state, err)
	}
}

// TestOnlyTheCoordinatorWrites calls Writeback with a write the judge passed, as the agent
// runner and as nobody: both are refused before any handler runs and nothing is written.
func TestOnlyTheCoordinatorWrites(t *testing.T) {
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	req := writeReq(t, st, "tkt_1")
	for _, tt := range []struct {
		caller string
		code   codes.Code
	}{{"agentrunner", codes.PermissionDenied}, {"", codes.Unauthenticated}, {"coordinator", codes.OK}} {
		var cc *grpc.ClientConn
		if tt.caller == "" {
			cc, err = st.Dial(st.WritebackAddr)
		} else {
			cc, err = st.DialAs(st.WritebackAddr, tt.caller)
		}
		if err != nil {
			t.Fatal(err)
		}
		_, err := handoffv1.NewWritebackServiceClient(cc).Write(context.Background(), req)
		if status.Code(err) != tt.code {
			t.Fatalf("Write as %q: %v, want %s", tt.caller, err, tt.code)
		}
		writes, _ := st.Store.LedgerEntries(context.Background())
		if want := map[bool]int{true: 1, false: 0}[tt.code == codes.OK]; len(writes) != want {
			t.Fatalf("after Write as %q: %d ledger entries, want %d", tt.caller, len(writes), want)
		}
	}
}

// flakyStore is the stack's store whose Ping fails while down is set: the store unreachable
// for health checks, the rest of it working.
type flakyStore struct {
	store.Store
	down atomic.Bool
}

func (f *flakyStore) Ping(ctx context.Context) error {
	if f.down.Load() {
		return errors.New("store unreachable (test)")
	}
	return f.Store.Ping(ctx)
}

// Under `handoff up` health follows the store as it does in the binaries: each service goes
// NOT_SERVING (for "" and its own name) while the store's Ping fails, and SERVING again once
// it answers.
func TestHealthFollowsTheStore(t *testing.T) {
	dir := t.TempDir()
	bolt, err := store.Open(filepath.Join(dir, "handoff.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	fs := &flakyStore{Store: bolt}
	st, err := stack.Start(context.Background(), stack.Config{DataDir: dir, CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Store: fs, HealthInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	type probe struct {
		hc   healthpb.HealthClient
		name string
	}
	var probes []probe
	for addr, svc := range map[string]string{
		st.CoordinatorAddr: handoffv1.CoordinatorService_ServiceDesc.ServiceName,
		st.RunnerAddr:      handoffv1.AgentRunnerService_ServiceDesc.ServiceName,
		st.WritebackAddr:   handoffv1.WritebackService_ServiceDesc.ServiceName,
	} {
		cc, err := st.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"", svc} {
			probes = append(probes, probe{healthpb.NewHealthClient(cc), name})
		}
	}
	all := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			for _, p := range probes {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := p.hc.Check(ctx, &healthpb.HealthCheckRequest{Service: p.name})
				cancel()
				if err != nil {
					t.Fatalf("health %q: %v", p.name, err)
				}
				if resp.GetStatus() != want {
					return false
				}
			}
			return true
		}
	}
	testkit.Eventually(t, 5*time.Second, "every service SERVING at the start", all(healthpb.HealthCheckResponse_SERVING))
	fs.down.Store(true)
	testkit.Eventually(t, 5*time.Second, "every service NOT_SERVING while the store's Ping fails", all(healthpb.HealthCheckResponse_NOT_SERVING))
	fs.down.Store(false)
	testkit.Eventually(t, 5*time.Second, "every service SERVING again once the store answers", all(healthpb.HealthCheckResponse_SERVING))
}
