package budget_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/budget"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
	"github.com/handoffhq/handoff/internal/testkit"
)

// fakeRunner is an AgentRunnerService whose Deliver sends an ACCEPTED Ack, then a result.
type fakeRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	delivers, checks atomic.Int32
	mu               sync.Mutex
	ctxWallets       []*handoffv1.Budget // budget.FromContext seen by Deliver
}

func (f *fakeRunner) Deliver(req *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	f.delivers.Add(1)
	p := req.GetPackage()
	if b, ok := budget.FromContext(stream.Context()); ok {
		f.mu.Lock()
		f.ctxWallets = append(f.ctxWallets, b)
		f.mu.Unlock()
	}
	ack := contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	if err := stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}); err != nil {
		return err
	}
	return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: &handoffv1.StageResult{
		JobId: p.GetJobId(), Stage: p.GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
		Traceparent: p.GetTrace().GetTraceparent(),
	}}})
}

func (f *fakeRunner) Check(_ context.Context, req *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	f.checks.Add(1)
	return &handoffv1.CheckResponse{Ack: contract.AckFor(req.GetPackage(), handoffv1.AckStatus_ACK_STATUS_ACCEPTED)}, nil
}

// serve runs a fakeRunner behind the chain validate -> budget, assembled as a service's
// server is (internal/server), and returns a client for it.
func serve(t *testing.T, w store.Wallets) (handoffv1.AgentRunnerServiceClient, *fakeRunner) {
	t.Helper()
	v, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	vopt := validate.WithRejecter(validate.PackageAckRejecter())
	runner := &fakeRunner{}
	srv, err := server.New(server.Service{
		Name:     "runner",
		Register: func(g *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(g, runner) },
		Unary:    []grpc.UnaryServerInterceptor{validate.UnaryServerInterceptor(v, vopt), budget.UnaryServerInterceptor(w)},
		Stream:   []grpc.StreamServerInterceptor{validate.StreamServerInterceptor(v, vopt), budget.StreamServerInterceptor(w)},
	}, server.WithoutIdentity(), server.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return handoffv1.NewAgentRunnerServiceClient(testkit.Serve(t, srv)), runner
}

// deliverCall is what one Deliver call got back.
type deliverCall struct {
	ack    *handoffv1.Ack
	result *handoffv1.StageResult
	extra  int // messages after the result
}

func callDeliver(ctx context.Context, c handoffv1.AgentRunnerServiceClient, p *handoffv1.HandoffPackage) (deliverCall, error) {
	var out deliverCall
	stream, err := c.Deliver(ctx, &handoffv1.DeliverRequest{Package: p})
	if err != nil {
		return out, err
	}
	for i := 0; ; i++ {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		switch {
		case i == 0:
			out.ack = m.GetAck()
		case i == 1:
			out.result = m.GetResult()
		default:
			out.extra++
		}
	}
}

func TestIntegrationInvalidPackageIsRejectedSchema(t *testing.T) {
	st := openBolt(t)
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 10})
	c, runner := serve(t, st)
	p := pkg("Draft!", "w1", usd, 10)
	p.JobId = ""
	got, err := callDeliver(context.Background(), c, p)
	if err != nil {
		t.Fatal(err)
	}
	if got.ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || got.result != nil || got.ack.GetWallet() != nil {
		t.Fatalf("got %+v", got)
	}
	fields := reasonFields(got.ack.GetReasons())
	if !slices.Contains(fields, "job_id") || !slices.Contains(fields, "stage") {
		t.Fatalf("reasons name %v, want job_id and stage", fields)
	}
	if n := runner.delivers.Load(); n != 0 {
		t.Fatalf("handler called %d times", n)
	}
	// validate runs before budget: a rejected package debits nothing.
	if hops := walletOf(t, st, "w1").GetHopsRemaining(); hops != 10 {
		t.Fatalf("hops = %d after a schema rejection, want 10", hops)
	}
	// Unary Check too.
	resp, err := c.Check(context.Background(), &handoffv1.CheckRequest{Package: p})
	if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || runner.checks.Load() != 0 {
		t.Fatalf("Check: %v %v (handler calls %d)", resp, err, runner.checks.Load())
	}
}

// THE acceptance test: one wallet with 10 hops, 100 concurrent hops on it.
func TestIntegrationConcurrentDebitsBolt(t *testing.T) {
	concurrentDebits(t, openBolt(t))
}

func TestIntegrationConcurrentDebitsRedis(t *testing.T) {
	concurrentDebits(t, storetest.OpenRedis(t))
}

func concurrentDebits(t *testing.T, w store.Wallets) {
	const (
		hops  = 10
		calls = 100
	)
	ctx := context.Background()
	openWallet(t, w, "run-1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: hops, RevisionsRemaining: 2})
	c, runner := serve(t, w)

	results := make([]deliverCall, calls)
	errs := make([]error, calls)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			<-start
			// Distinct stages and rounds: 100 different hops of one job.
			p := pkg(fmt.Sprintf("s%d", i), "run-1", usd, hops)
			p.Evaluator = &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: uint32(i % 7)}
			results[i], errs[i] = callDeliver(ctx, c, p)
		})
	}
	close(start)
	wg.Wait()

	var accepted, rejected int
	var left []uint32
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		switch r.ack.GetStatus() {
		case handoffv1.AckStatus_ACK_STATUS_ACCEPTED:
			accepted++
			wl := r.ack.GetWallet()
			if wl == nil || wl.GetWalletId() != "run-1" || wl.GetUsdRemainingMicros() != usd || wl.GetRevisionsRemaining() != 2 {
				t.Errorf("call %d: ACCEPTED with wallet %v", i, wl)
			}
			left = append(left, wl.GetHopsRemaining())
			if r.result.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED || r.result.GetStage() != fmt.Sprintf("s%d", i) || r.extra != 0 {
				t.Errorf("call %d: after the Ack got %+v", i, r)
			}
		case handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET:
			rejected++
			rs := r.ack.GetReasons()
			if len(rs) != 1 || rs[0].GetField() != budget.FieldHops || rs[0].GetRule() != budget.RuleEmpty {
				t.Errorf("call %d: REJECTED_BUDGET reasons %v, want one %s/%s", i, rs, budget.FieldHops, budget.RuleEmpty)
			}
			if r.ack.GetWallet() != nil || r.result != nil || r.ack.GetStage() != fmt.Sprintf("s%d", i) {
				t.Errorf("call %d: rejected with %+v", i, r)
			}
		default:
			t.Errorf("call %d: ack %v", i, r.ack)
		}
	}
	if accepted != hops || rejected != calls-hops {
		t.Fatalf("accepted %d, rejected %d; want %d and %d", accepted, rejected, hops, calls-hops)
	}
	// Every accepted hop saw a different wallet: 9, 8, ..., 0, each once.
	slices.Sort(left)
	if want := []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}; !slices.Equal(left, want) {
		t.Fatalf("hops left seen by the accepted calls = %v, want %v", left, want)
	}
	if n := runner.delivers.Load(); n != hops {
		t.Fatalf("handler called %d times, want %d", n, hops)
	}
	runner.mu.Lock()
	if len(runner.ctxWallets) != hops {
		t.Errorf("handler saw a wallet in its context %d times, want %d", len(runner.ctxWallets), hops)
	}
	runner.mu.Unlock()
	final := walletOf(t, w, "run-1")
	if final.GetHopsRemaining() != 0 || final.GetUsdRemainingMicros() != usd || final.GetRevisionsRemaining() != 2 {
		t.Fatalf("wallet ends at %v, want 0 hops and the money untouched", final)
	}
	// Never below zero: the next debit finds it empty and takes nothing.
	if _, err := w.Debit(ctx, "run-1", store.Debit{Hops: 1}); !errors.Is(err, store.ErrWalletEmpty) {
		t.Fatalf("debit of an empty wallet: %v", err)
	}
	if again := walletOf(t, w, "run-1"); again.GetHopsRemaining() != 0 {
		t.Fatalf("wallet after a refused debit: %v", again)
	}
}

func TestIntegrationNoWalletZeroMoney(t *testing.T) {
	st := openBolt(t)
	c, runner := serve(t, st)
	got, err := callDeliver(context.Background(), c, pkg("draft", "", 0, 3))
	if err != nil {
		t.Fatal(err)
	}
	if got.ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || got.ack.GetWallet() != nil || got.result != nil {
		t.Fatalf("got %+v", got)
	}
	if f := reasonFields(got.ack.GetReasons()); !slices.Equal(f, []string{budget.FieldMoney}) {
		t.Fatalf("reasons name %v, want [%s]", f, budget.FieldMoney)
	}
	if runner.delivers.Load() != 0 {
		t.Fatal("handler called")
	}
	// Enough in the package, no wallet: accepted without a debit (ack.wallet nil).
	got, err = callDeliver(context.Background(), c, pkg("draft", "", usd, 3))
	if err != nil || got.ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || got.ack.GetWallet() != nil || got.result == nil {
		t.Fatalf("got %+v, %v", got, err)
	}
}

// TestIntegrationOtherJobsWallet: over gRPC, a package naming another job's wallet, or an
// unknown one, is REJECTED_BUDGET naming budget.wallet_id, whatever its own numbers say:
// the other wallet is untouched and the handler never runs.
func TestIntegrationOtherJobsWallet(t *testing.T) {
	st := openBolt(t)
	theirs := &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 6}
	if _, err := st.OpenWallet(context.Background(), "run-y", "job-y", theirs); err != nil {
		t.Fatal(err)
	}
	c, runner := serve(t, st)
	for _, id := range []string{"run-y", "elsewhere-1"} {
		for range 6 {
			got, err := callDeliver(context.Background(), c, pkg("draft", id, usd, 2))
			if err != nil {
				t.Fatal(err)
			}
			if got.ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || got.ack.GetWallet() != nil || got.result != nil ||
				!slices.Equal(reasonFields(got.ack.GetReasons()), []string{budget.FieldWallet}) {
				t.Fatalf("wallet %s: got %+v; want REJECTED_BUDGET naming %s", id, got, budget.FieldWallet)
			}
		}
	}
	if runner.delivers.Load() != 0 {
		t.Fatalf("handler called %d times, want 0", runner.delivers.Load())
	}
	if !testkit.Equal(t, walletOf(t, st, "run-y"), theirs, "job-y's wallet (untouched)") {
		t.FailNow()
	}
	if _, err := st.Wallet(context.Background(), "elsewhere-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the interceptor created a wallet: %v", err)
	}
}

func TestIntegrationCheckDoesNotDebit(t *testing.T) {
	st := openBolt(t)
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 1})
	c, runner := serve(t, st)
	for range 3 {
		resp, err := c.Check(context.Background(), &handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 1)})
		if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || resp.GetAck().GetWallet() != nil {
			t.Fatalf("Check: %v %v", resp, err)
		}
	}
	if runner.checks.Load() != 3 || walletOf(t, st, "w1").GetHopsRemaining() != 1 {
		t.Fatalf("checks=%d wallet=%v; want 3 and 1 hop left", runner.checks.Load(), walletOf(t, st, "w1"))
	}
	// Deliver takes the last hop; Check then answers what Deliver would.
	got, err := callDeliver(context.Background(), c, pkg("draft", "w1", usd, 1))
	if err != nil || got.ack.GetWallet().GetHopsRemaining() != 0 || got.ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("Deliver: %+v %v", got, err)
	}
	resp, err := c.Check(context.Background(), &handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 1)})
	if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET {
		t.Fatalf("Check after the last hop: %v %v", resp, err)
	}
	if runner.checks.Load() != 3 {
		t.Fatal("Check handler called for a rejected package")
	}
}
