package budget_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/budget"
	"github.com/handoffhq/handoff/internal/interceptor/hop/hoptest"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
)

const (
	tp      = testkit.Traceparent
	deliver = handoffv1.AgentRunnerService_Deliver_FullMethodName
	check   = handoffv1.AgentRunnerService_Check_FullMethodName
	usd     = 1_000_000
)

func openBolt(t *testing.T) *store.Bolt {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// openWallet opens wallet id of job-1, the job of every package pkg makes.
func openWallet(t *testing.T, w store.Wallets, id string, b *handoffv1.Budget) {
	t.Helper()
	if _, err := w.OpenWallet(context.Background(), id, "job-1", b); err != nil {
		t.Fatal(err)
	}
}

func walletOf(t *testing.T, w store.Wallets, id string) *handoffv1.Budget {
	t.Helper()
	b, err := w.Wallet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pkg is a valid package of job-1 for stage, whose budget names walletID.
func pkg(stage, walletID string, usdLeft int64, hops uint32) *handoffv1.HandoffPackage {
	return testkit.Package(testkit.AtStage(stage),
		testkit.WithBudget(&handoffv1.Budget{UsdRemainingMicros: usdLeft, HopsRemaining: hops, RevisionsRemaining: 2, WalletId: walletID}))
}

// fakeWallets wraps a real store, counts calls and can fail them.
type fakeWallets struct {
	store.Wallets
	debits, reads atomic.Int32
	debitErr      error
	readErr       error
}

func (f *fakeWallets) Debit(ctx context.Context, id string, d store.Debit) (*handoffv1.Budget, error) {
	f.debits.Add(1)
	if f.debitErr != nil {
		return nil, f.debitErr
	}
	return f.Wallets.Debit(ctx, id, d)
}

func (f *fakeWallets) Wallet(ctx context.Context, id string) (*handoffv1.Budget, error) {
	f.reads.Add(1)
	if f.readErr != nil {
		return nil, f.readErr
	}
	return f.Wallets.Wallet(ctx, id)
}

func (f *fakeWallets) WalletFor(ctx context.Context, id, job string) (*handoffv1.Budget, error) {
	f.reads.Add(1)
	if f.readErr != nil {
		return nil, f.readErr
	}
	return f.Wallets.WalletFor(ctx, id, job)
}

// noWallets fails the test on any store call.
type noWallets struct{ t *testing.T }

func (n noWallets) OpenWallet(context.Context, string, string, *handoffv1.Budget) (*handoffv1.Budget, error) {
	n.t.Error("store used")
	return nil, errors.New("unexpected")
}
func (n noWallets) Debit(context.Context, string, store.Debit) (*handoffv1.Budget, error) {
	n.t.Error("store used")
	return nil, errors.New("unexpected")
}
func (n noWallets) Wallet(context.Context, string) (*handoffv1.Budget, error) {
	n.t.Error("store used")
	return nil, errors.New("unexpected")
}
func (n noWallets) WalletFor(context.Context, string, string) (*handoffv1.Budget, error) {
	n.t.Error("store used")
	return nil, errors.New("unexpected")
}

// checkHandler is a unary Check handler that answers ACCEPTED and records what it saw.
type checkHandler struct {
	calls  int
	wallet *handoffv1.Budget // from budget.FromContext
	resp   *handoffv1.CheckResponse
	ack    *handoffv1.Ack // set to answer with this ack instead
}

func (h *checkHandler) handle(ctx context.Context, req any) (any, error) {
	h.calls++
	h.wallet, _ = budget.FromContext(ctx)
	ack := h.ack
	if ack == nil {
		ack = contract.AckFor(req.(*handoffv1.CheckRequest).GetPackage(), handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	}
	h.resp = &handoffv1.CheckResponse{Ack: ack}
	return h.resp, nil
}

func runUnary(w store.Wallets, method string, req any, h grpc.UnaryHandler, opts ...budget.Option) (any, error) {
	return budget.UnaryServerInterceptor(w, opts...)(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method}, h)
}

// ackIn returns the Ack of a CheckResponse or DeliverResponse.
func ackIn(resp any) *handoffv1.Ack {
	switch r := resp.(type) {
	case *handoffv1.CheckResponse:
		return r.GetAck()
	case *handoffv1.DeliverResponse:
		return r.GetAck()
	}
	return nil
}

func reasonFields(rs []*handoffv1.Reason) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.GetField())
	}
	return out
}

func TestUnaryCheckReadsButDoesNotDebit(t *testing.T) {
	st := openBolt(t)
	w := &fakeWallets{Wallets: st}
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 3})
	h := &checkHandler{}
	resp, err := runUnary(w, check, &handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 3)}, h.handle)
	if err != nil || h.calls != 1 {
		t.Fatalf("err=%v calls=%d", err, h.calls)
	}
	if ack := resp.(*handoffv1.CheckResponse).GetAck(); ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || ack.GetWallet() != nil {
		t.Fatalf("ack = %v, want ACCEPTED without wallet", ack)
	}
	if h.wallet != nil {
		t.Fatalf("FromContext = %v without a debit", h.wallet)
	}
	if w.debits.Load() != 0 || w.reads.Load() != 1 {
		t.Fatalf("debits=%d reads=%d, want 0 and 1", w.debits.Load(), w.reads.Load())
	}
	if got := walletOf(t, st, "w1").GetHopsRemaining(); got != 3 {
		t.Fatalf("hops = %d, want 3 (untouched)", got)
	}

	// Check on a stored wallet with no hops answers what Deliver would: REJECTED_BUDGET,
	// judged by the stored wallet, not the package's (stale) numbers.
	openWallet(t, st, "w0", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 0})
	h = &checkHandler{}
	resp, err = runUnary(w, check, &handoffv1.CheckRequest{Package: pkg("draft", "w0", usd, 3)}, h.handle)
	if err != nil || h.calls != 0 {
		t.Fatalf("err=%v calls=%d", err, h.calls)
	}
	ack := resp.(*handoffv1.CheckResponse).GetAck()
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || !slices.Equal(reasonFields(ack.GetReasons()), []string{budget.FieldHops}) {
		t.Fatalf("ack = %v", ack)
	}
}

func TestUnaryDebitMethod(t *testing.T) {
	st := openBolt(t)
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 3, RevisionsRemaining: 1})
	h := &checkHandler{}
	resp, err := runUnary(st, check, &handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 3)}, h.handle, budget.WithDebitMethods(check))
	if err != nil || h.calls != 1 {
		t.Fatalf("err=%v calls=%d", err, h.calls)
	}
	want := &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 2, RevisionsRemaining: 1, WalletId: "w1"}
	if !testkit.Equal(t, h.wallet, want, "FromContext") || !testkit.Equal(t, resp.(*handoffv1.CheckResponse).GetAck().GetWallet(), want, "ack.wallet") {
		t.FailNow()
	}
	if h.resp.GetAck().GetWallet() != nil {
		t.Fatal("the handler's own response was modified")
	}
	// A wallet the handler set itself is kept.
	own := &handoffv1.Budget{HopsRemaining: 42}
	h = &checkHandler{ack: &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED, Wallet: own}}
	resp, _ = runUnary(st, check, &handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 3)}, h.handle, budget.WithDebitMethods(check))
	if !testkit.Equal(t, resp.(*handoffv1.CheckResponse).GetAck().GetWallet(), own, "ack.wallet (the handler's)") {
		t.FailNow()
	}
	if got := walletOf(t, st, "w1").GetHopsRemaining(); got != 1 {
		t.Fatalf("hops = %d, want 1", got)
	}
}

func TestPackageNumbers(t *testing.T) {
	st := openBolt(t)
	for _, tc := range []struct {
		name     string
		walletID string
		usd      int64
		hops     uint32
		want     []string // nil: accepted
	}{
		{"no wallet, enough", "", usd, 1, nil},
		{"no wallet, no money", "", 0, 3, []string{budget.FieldMoney}},
		{"no wallet, no hops", "", usd, 0, []string{budget.FieldHops}},
		{"no wallet, nothing", "", 0, 0, []string{budget.FieldMoney, budget.FieldHops}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{deliver, check} {
				h := &checkHandler{}
				var rejected []string
				resp, err := runUnary(st, method, &handoffv1.CheckRequest{Package: pkg("draft", tc.walletID, tc.usd, tc.hops)}, h.handle,
					budget.WithDebitMethods(deliver, check),
					budget.WithOnReject(func(m string, rs []*handoffv1.Reason) { rejected = reasonFields(rs) }))
				if err != nil {
					t.Fatal(err)
				}
				ack := ackIn(resp)
				if tc.want == nil {
					if h.calls != 1 || ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || ack.GetWallet() != nil || h.wallet != nil {
						t.Fatalf("%s: calls=%d ack=%v ctx wallet=%v", method, h.calls, ack, h.wallet)
					}
					continue
				}
				if h.calls != 0 || ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || ack.GetWallet() != nil {
					t.Fatalf("%s: calls=%d ack=%v", method, h.calls, ack)
				}
				if got := reasonFields(ack.GetReasons()); !slices.Equal(got, tc.want) {
					t.Fatalf("%s: reasons name %v, want %v", method, got, tc.want)
				}
				for _, r := range ack.GetReasons() {
					if r.GetRule() != budget.RuleEmpty || r.GetMessage() == "" {
						t.Fatalf("reason %v", r)
					}
				}
				// The hook gets request-relative paths.
				if len(rejected) == 0 || rejected[0] != "package."+tc.want[0] {
					t.Fatalf("OnReject saw %v", rejected)
				}
			}
		})
	}
}

// TestWalletNotTheJobs: a wallet_id that is not a wallet of the package's job in the store
// (unknown, or another job's) is REJECTED_BUDGET naming budget.wallet_id, on Deliver and
// Check alike, whatever the package's own numbers say; nothing is taken, and the words are
// the same for both, so the answer says nothing of the other job's wallet.
func TestWalletNotTheJobs(t *testing.T) {
	st := openBolt(t)
	theirs := &handoffv1.Budget{UsdRemainingMicros: 424242, HopsRemaining: 7, RevisionsRemaining: 3}
	if _, err := st.OpenWallet(context.Background(), "run-theirs", "job-2", theirs); err != nil {
		t.Fatal(err)
	}
	msgs := map[string]string{}
	for _, id := range []string{"run-theirs", "run-nobody"} {
		for _, method := range []string{deliver, check} {
			h := &checkHandler{}
			resp, err := runUnary(st, method, &handoffv1.CheckRequest{Package: pkg("draft", id, usd, 3)}, h.handle)
			if err != nil {
				t.Fatal(err)
			}
			ack := ackIn(resp)
			if h.calls != 0 || ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || ack.GetWallet() != nil || len(ack.GetReasons()) != 1 {
				t.Fatalf("%s %s: calls=%d ack=%v; want REJECTED_BUDGET with one reason, no wallet", id, method, h.calls, ack)
			}
			r := ack.GetReasons()[0]
			if r.GetField() != budget.FieldWallet || r.GetRule() != budget.RuleWallet {
				t.Fatalf("%s %s: reason %v; want %s/%s", id, method, r, budget.FieldWallet, budget.RuleWallet)
			}
			msgs[id] = strings.ReplaceAll(r.GetMessage(), id, "ID")
		}
	}
	if msgs["run-theirs"] != msgs["run-nobody"] {
		t.Fatalf("another job's wallet and an unknown one are told apart:\n%q\n%q", msgs["run-theirs"], msgs["run-nobody"])
	}
	for _, leak := range []string{"424242", "7", "job-2"} {
		if strings.Contains(msgs["run-theirs"], leak) {
			t.Fatalf("the reason %q shows %q of the other job's wallet", msgs["run-theirs"], leak)
		}
	}
	if !testkit.Equal(t, walletOf(t, st, "run-theirs"), theirs, "the other job's wallet (untouched)") {
		t.FailNow()
	}
	if _, err := st.Wallet(context.Background(), "run-nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the interceptor created a wallet: %v", err)
	}
}

func TestStoreErrorsFailClosed(t *testing.T) {
	st := openBolt(t)
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 3})
	req := &handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 3)}
	for _, tc := range []struct {
		name   string
		w      *fakeWallets
		method string
		code   codes.Code
	}{
		{"debit fails", &fakeWallets{Wallets: st, debitErr: errors.New("disk on fire")}, deliver, codes.Unavailable},
		{"read fails", &fakeWallets{Wallets: st, readErr: errors.New("disk on fire")}, check, codes.Unavailable},
		{"debit cancelled", &fakeWallets{Wallets: st, debitErr: context.Canceled}, deliver, codes.Canceled},
		{"debit empty, then read fails", &fakeWallets{Wallets: st, debitErr: store.ErrWalletEmpty, readErr: errors.New("gone")}, deliver, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &checkHandler{}
			_, err := runUnary(tc.w, tc.method, req, h.handle)
			if status.Code(err) != tc.code || h.calls != 0 {
				t.Fatalf("err=%v calls=%d, want %v and no handler call", err, h.calls, tc.code)
			}
			if tc.code == codes.Unavailable && status.Convert(err).Message()[:len("wallet store: ")] != "wallet store: " {
				t.Fatalf("message %q", status.Convert(err).Message())
			}
		})
	}
}

func TestNoRejecterIsResourceExhausted(t *testing.T) {
	st := openBolt(t)
	h := &checkHandler{}
	_, err := runUnary(st, check, &handoffv1.CheckRequest{Package: pkg("draft", "", 0, 1)}, h.handle, budget.WithRejecter(nil))
	st2 := status.Convert(err)
	if st2.Code() != codes.ResourceExhausted || h.calls != 0 {
		t.Fatalf("err=%v calls=%d", err, h.calls)
	}
	var qf *errdetails.QuotaFailure
	for _, d := range st2.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			qf = q
		}
	}
	if qf == nil || len(qf.GetViolations()) != 1 || qf.GetViolations()[0].GetSubject() != "package."+budget.FieldMoney {
		t.Fatalf("QuotaFailure = %v", qf)
	}
	// The default rejecter declines for methods other than Deliver and Check.
	_, err = runUnary(st, handoffv1.WritebackService_Write_FullMethodName, &handoffv1.WriteRequest{Package: pkg("draft", "", 0, 1)}, h.handle)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err=%v", err)
	}
}

func TestUnaryPassThrough(t *testing.T) {
	w := noWallets{t}
	calls := 0
	h := func(ctx context.Context, req any) (any, error) { calls++; return &handoffv1.GetJobResponse{}, nil }
	if _, err := runUnary(w, handoffv1.CoordinatorService_GetJob_FullMethodName, &handoffv1.GetJobRequest{RunId: "r"}, h); err != nil || calls != 1 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}
	// A package-carrying request without its package: fail closed.
	if _, err := runUnary(w, check, &handoffv1.CheckRequest{}, h); status.Code(err) != codes.InvalidArgument || calls != 1 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}
}

// ---- streams ----

// deliverHandler mimics a runner: ACCEPTED ack, then a result.
type deliverHandler struct {
	calls   int
	got     *handoffv1.DeliverRequest
	wallet  *handoffv1.Budget
	nextErr error
	ackSent *handoffv1.Ack
}

func (h *deliverHandler) handle(_ any, ss grpc.ServerStream) error {
	h.calls++
	h.got = &handoffv1.DeliverRequest{}
	if err := ss.RecvMsg(h.got); err != nil {
		return err
	}
	h.nextErr = ss.RecvMsg(&handoffv1.DeliverRequest{})
	h.wallet, _ = budget.FromContext(ss.Context())
	h.ackSent = contract.AckFor(h.got.GetPackage(), handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	if err := ss.SendMsg(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: h.ackSent}}); err != nil {
		return err
	}
	return ss.SendMsg(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: &handoffv1.StageResult{
		JobId: h.got.GetPackage().GetJobId(), Stage: h.got.GetPackage().GetStage(), Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED,
	}}})
}

var deliverInfo = &grpc.StreamServerInfo{FullMethod: deliver, IsServerStream: true}

func TestStreamDebitStampsAck(t *testing.T) {
	st := openBolt(t)
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 2})
	req := &handoffv1.DeliverRequest{Package: pkg("draft", "w1", usd, 2), Agent: "drafter"}
	ss := &hoptest.Stream{In: []proto.Message{req}}
	h := &deliverHandler{}
	if err := budget.StreamServerInterceptor(st)(nil, ss, deliverInfo, h.handle); err != nil {
		t.Fatal(err)
	}
	if h.calls != 1 || !proto.Equal(h.got, req) || h.nextErr != io.EOF || ss.Recvs != 1 {
		t.Fatalf("calls=%d got=%v next=%v recvs=%d", h.calls, h.got, h.nextErr, ss.Recvs)
	}
	want := &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 1, WalletId: "w1"}
	if !testkit.Equal(t, h.wallet, want, "FromContext") {
		t.FailNow()
	}
	if len(ss.Sent) != 2 {
		t.Fatalf("sent %d messages", len(ss.Sent))
	}
	if !testkit.Equal(t, ss.Sent[0].(*handoffv1.DeliverResponse).GetAck().GetWallet(), want, "ack.wallet") {
		t.FailNow()
	}
	if h.ackSent.GetWallet() != nil {
		t.Fatal("the handler's own ack was modified")
	}
	if ss.Sent[1].(*handoffv1.DeliverResponse).GetResult() == nil {
		t.Fatalf("second message = %v", ss.Sent[1])
	}
}

func TestStreamEmptyWalletNamesThePart(t *testing.T) {
	st := openBolt(t)
	openWallet(t, st, "nohops", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 0})
	openWallet(t, st, "nomoney", &handoffv1.Budget{UsdRemainingMicros: 0, HopsRemaining: 4})
	openWallet(t, st, "nothing", &handoffv1.Budget{})
	for id, want := range map[string][]string{
		"nohops":  {budget.FieldHops},
		"nomoney": {budget.FieldMoney},
		"nothing": {budget.FieldMoney, budget.FieldHops},
	} {
		t.Run(id, func(t *testing.T) {
			// The package's own numbers are fine: the stored wallet decides.
			ss := &hoptest.Stream{In: []proto.Message{&handoffv1.DeliverRequest{Package: pkg("draft", id, usd, 5)}}}
			h := &deliverHandler{}
			if err := budget.StreamServerInterceptor(st)(nil, ss, deliverInfo, h.handle); err != nil {
				t.Fatal(err)
			}
			if h.calls != 0 || len(ss.Sent) != 1 {
				t.Fatalf("calls=%d sent=%d", h.calls, len(ss.Sent))
			}
			ack := ss.Sent[0].(*handoffv1.DeliverResponse).GetAck()
			if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET || ack.GetWallet() != nil || ack.GetJobId() != "job-1" {
				t.Fatalf("ack = %v", ack)
			}
			if got := reasonFields(ack.GetReasons()); !slices.Equal(got, want) {
				t.Fatalf("reasons name %v, want %v", got, want)
			}
		})
	}
}

// Streams the interceptor is not configured for pass through, but never carry a package
// past it unchecked.
func TestStreamUnconfigured(t *testing.T) {
	w := noWallets{t}
	info := &grpc.StreamServerInfo{FullMethod: handoffv1.CoordinatorService_WatchJob_FullMethodName, IsServerStream: true}
	h := func(_ any, ss grpc.ServerStream) error { return ss.RecvMsg(&handoffv1.WatchJobRequest{}) }
	ss := &hoptest.Stream{In: []proto.Message{&handoffv1.WatchJobRequest{RunId: "r"}}}
	if err := budget.StreamServerInterceptor(w)(nil, ss, info, h); err != nil {
		t.Fatal(err)
	}
	info = &grpc.StreamServerInfo{FullMethod: "/x.Y/Deliver2", IsServerStream: true}
	h = func(_ any, ss grpc.ServerStream) error { return ss.RecvMsg(&handoffv1.DeliverRequest{}) }
	ss = &hoptest.Stream{In: []proto.Message{&handoffv1.DeliverRequest{Package: pkg("draft", "", usd, 1)}}}
	if err := budget.StreamServerInterceptor(w)(nil, ss, info, h); status.Code(err) != codes.Internal {
		t.Fatalf("err = %v, want Internal", err)
	}
	// Configured, it is checked.
	ss = &hoptest.Stream{In: []proto.Message{&handoffv1.DeliverRequest{Package: pkg("draft", "", usd, 1)}}}
	opt := budget.WithStreamRequest("/x.Y/Deliver2", func() proto.Message { return &handoffv1.DeliverRequest{} })
	if err := budget.StreamServerInterceptor(w, opt)(nil, ss, info, h); err != nil {
		t.Fatal(err)
	}
}

func TestOptionsMisconfigured(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	mustPanic("wrong type", func() {
		budget.WithStreamRequest(deliver, func() proto.Message { return &handoffv1.CheckRequest{} })
	})
	mustPanic("malformed stream method", func() { budget.WithStreamRequest("Deliver", nil) })
	mustPanic("malformed debit method", func() { budget.WithDebitMethods("handoff.v1.AgentRunnerService/Deliver") })
	mustPanic("nil store", func() { budget.StreamServerInterceptor(nil) })
}

// TestDebitedInContext: a debit already made with the claim (budget.WithDebited) is used
// as is, without asking the store again; one for another wallet is ignored.
func TestDebitedInContext(t *testing.T) {
	after := &handoffv1.Budget{UsdRemainingMicros: 7, HopsRemaining: 4}
	held := &handoffv1.Budget{UsdRemainingMicros: 7, HopsRemaining: 0}
	run := func(w store.Wallets, d budget.Debited) (*checkHandler, any, error) {
		h := &checkHandler{}
		ctx := budget.WithDebited(context.Background(), d)
		resp, err := budget.UnaryServerInterceptor(w, budget.WithDebitMethods(check))(ctx,
			&handoffv1.CheckRequest{Package: pkg("draft", "w1", usd, 3)}, &grpc.UnaryServerInfo{FullMethod: check}, h.handle)
		return h, resp, err
	}

	h, _, err := run(noWallets{t}, budget.Debited{WalletID: "w1", Wallet: after})
	want := &handoffv1.Budget{UsdRemainingMicros: 7, HopsRemaining: 4, WalletId: "w1"}
	if err != nil || h.calls != 1 || !proto.Equal(h.wallet, want) {
		t.Fatalf("debited: err=%v calls=%d wallet=%v; want the handler run with %v", err, h.calls, h.wallet, want)
	}

	h, resp, err := run(noWallets{t}, budget.Debited{WalletID: "w1", Err: store.ErrWalletEmpty, Wallet: held})
	ack := ackIn(resp)
	if err != nil || h.calls != 0 || ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET ||
		!slices.Equal(reasonFields(ack.GetReasons()), []string{budget.FieldHops}) {
		t.Fatalf("refused: err=%v calls=%d ack=%v; want REJECTED_BUDGET naming only %s (money is left)", err, h.calls, ack, budget.FieldHops)
	}

	// A Debited for another wallet does not stand in for this one: the store is asked.
	st := openBolt(t)
	openWallet(t, st, "w1", &handoffv1.Budget{UsdRemainingMicros: usd, HopsRemaining: 3})
	if h, _, err = run(st, budget.Debited{WalletID: "other", Wallet: after}); err != nil || h.wallet.GetHopsRemaining() != 2 {
		t.Fatalf("other wallet: err=%v wallet=%v; want the store's debit (2 hops left)", err, h.wallet)
	}
}
