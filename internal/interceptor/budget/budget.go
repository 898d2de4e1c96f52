// Package budget enforces the job's one wallet at the receiving service: gRPC server
// interceptors that check a hop's budget, and debit it, before any handler runs, so an empty
// wallet costs no agent work.
//
// They act on requests that carry a handoff package (a field named "package" of message type
// handoff.v1.HandoffPackage, found by reflection); other requests pass through untouched.
//
//   - budget.wallet_id is set, the wallet is in the store and records the package's job_id,
//     and the method debits (WithDebitMethods; default AgentRunnerService/Deliver): one hop
//     is taken from the wallet, atomically, with Wallets.Debit(ctx, id, HopFor(job_id)).
//     When the wallet cannot cover it (store.ErrWalletEmpty) the package is rejected
//     (REJECTED_BUDGET, rule "budget.empty", one reason per empty part, read once with
//     Wallets.WalletFor: "budget.hops_remaining" and/or "budget.usd_remaining_micros"). When
//     the debit succeeds, the wallet after it (with its wallet_id) is in the handler's
//     context (FromContext) and in ack.wallet of every Ack the handler sends that leaves it
//     unset, so the sender knows the hop was already paid for.
//   - The context already carries the outcome of this hop's debit for that wallet
//     (WithDebited: the agent runner debits in the same store round trip as its
//     idempotency claim, store.Admitter): it is used as above, and the store is not asked
//     again, not even to name the empty part of a refused debit.
//   - The wallet is the job's and the method does not debit (AgentRunnerService/Check):
//     the stored wallet is read (WalletFor) and the package rejected when it has no hops or
//     no money, or, when the store keeps verdicts (store.Verdicts), when it is a silent
//     reset (REJECTED_SCHEMA, as Deliver answers it); nothing is taken and ack.wallet is
//     left alone.
//   - budget.wallet_id names a wallet this store does not hold (store.ErrNotFound), or one
//     of another job, or one that records no job (store.ErrWrongJob): the package is
//     rejected (REJECTED_BUDGET, field "budget.wallet_id", rule "budget.wallet"), fail
//     closed: a package pays only from its own job's wallet, and a runner whose store does
//     not hold the coordinator's wallets runs nothing the coordinator sends. Both cases get
//     the same words, which name only what the package itself said: the reason shows
//     nothing of another job's wallet, not even whether it exists.
//   - No wallet_id (a package sent by hand): the package's own numbers are checked
//     (usd_remaining_micros == 0, hops_remaining == 0: one reason per empty field); nothing
//     is debited and ack.wallet is left nil.
//   - The context's debit was refused as a silent reset (store.ErrSilentReset, found by
//     the runner's Admit in the same round trip): the package is rejected REJECTED_SCHEMA
//     (field "evaluator.last_verdict", rule RuleReset) by PackageAckRejecter.
//   - Any other store error is codes.Unavailable ("wallet store: ..."), a cancelled or
//     expired call its context's code: the interceptor fails closed and never lets a package
//     through unchecked.
//
// A rejection is answered by the Rejecter (default PackageAckRejecter: a REJECTED_BUDGET Ack
// for AgentRunnerService Deliver and Check) or else ends with codes.ResourceExhausted; the
// handler is not called. Reasons given to the Rejecter and the WithOnReject hook name fields
// relative to the request ("package.budget.hops_remaining"); the Ack's are relative to the
// package ("budget.hops_remaining").
//
// Chain order: validate runs before budget (grpc.ChainStreamInterceptor(validate..., budget...)),
// so budget only sees packages that passed the schema gate: wallet_id is well formed, the
// numbers are not negative. budget checks nothing else about the package (a request without
// one is InvalidArgument, fail closed).
//
// A debit is final: the store has no refund. A handler that refuses the package after the
// debit (REJECTED_ROLE, DUPLICATE, an error) still leaves the hop taken, and any Ack it sends
// says so in ack.wallet.
package budget

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/store"
)

// HopDebit is what one hop takes from the job's wallet: one hop, and only while money is
// left. A package's hop is HopFor its job.
var HopDebit = store.Debit{Hops: 1, RequireMoney: true}

// HopFor is HopDebit paid by job: the wallet must be job's (store.Debit.Job).
func HopFor(job string) store.Debit {
	d := HopDebit
	d.Job = job
	return d
}

// Rule ids of budget rejections: an empty wallet (the agent runner's RuleBudgetEmpty), and a
// wallet_id that is not the package's job's wallet in the store.
const (
	RuleEmpty  = "budget.empty"
	RuleWallet = "budget.wallet"
	// RuleReset: after a FAIL in the job, the package lacks evaluator.last_verdict or claims
	// a PASS no judge gave (store.ErrSilentReset). Answered REJECTED_SCHEMA, not
	// REJECTED_BUDGET: the package is malformed for the job, not short of money.
	RuleReset = "evaluator.reset"
)

// FieldVerdict is the field a silent reset names.
const FieldVerdict = "evaluator.last_verdict"

// Field paths of the budget reasons, relative to the package.
const (
	FieldHops   = "budget.hops_remaining"
	FieldMoney  = "budget.usd_remaining_micros"
	FieldWallet = "budget.wallet_id"
)

type ctxKey struct{}

// FromContext returns the job's wallet after this call's debit (a copy, wallet_id set), and
// whether there was one: false when the method does not debit or the package had no wallet
// in this store.
func FromContext(ctx context.Context) (*handoffv1.Budget, bool) {
	b, ok := ctx.Value(ctxKey{}).(*handoffv1.Budget)
	if !ok || b == nil {
		return nil, false
	}
	return proto.Clone(b).(*handoffv1.Budget), true
}

// Debited is a hop debit made for this call before the budget interceptor ran, in the same
// store round trip as the call's idempotency claim (store.Admitter). Put in the context with
// WithDebited, it replaces the interceptor's own Debit for that wallet, so a hop costs one
// store round trip instead of two.
type Debited struct {
	WalletID string
	// Err is nil (debited: Wallet is what is left), store.ErrWalletEmpty (nothing taken:
	// Wallet is what the wallet holds) or store.ErrNotFound (no such wallet).
	Err    error
	Wallet *handoffv1.Budget
}

type debitedKey struct{}

// WithDebited returns ctx carrying d for the budget interceptor (and DebitedFrom).
func WithDebited(ctx context.Context, d Debited) context.Context {
	return context.WithValue(ctx, debitedKey{}, d)
}

// DebitedFrom returns the Debited in ctx, if any.
func DebitedFrom(ctx context.Context) (Debited, bool) {
	d, ok := ctx.Value(debitedKey{}).(Debited)
	return d, ok
}

// UnaryServerInterceptor checks (and, for methods in WithDebitMethods, debits) the budget of
// every unary request that carries a handoff package, before the handler runs; see the
// package documentation. After a debit, the handler's response gets the post-debit wallet
// in its ack.wallet (a top-level field "ack" of type handoff.v1.Ack, e.g. CheckResponse)
// when the handler left it unset.
func UnaryServerInterceptor(w store.Wallets, opts ...Option) grpc.UnaryServerInterceptor {
	if w == nil {
		panic("budget: UnaryServerInterceptor: nil Wallets")
	}
	o := newOptions(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := req.(proto.Message)
		if !ok {
			return handler(ctx, req) // not protobuf: it cannot carry a handoff package
		}
		fd := hop.PackageField(m.ProtoReflect().Descriptor())
		if fd == nil {
			return handler(ctx, req)
		}
		wallet, reasons, err := o.decide(ctx, w, info.FullMethod, m, fd)
		if err != nil {
			return nil, err
		}
		if len(reasons) > 0 {
			if resp, ok := o.Reject(info.FullMethod, m, reasons); ok {
				return resp, nil
			}
			return nil, exhausted(reasons)
		}
		if wallet == nil {
			return handler(ctx, req)
		}
		resp, err := handler(context.WithValue(ctx, ctxKey{}, wallet), req)
		if err != nil {
			return resp, err
		}
		return stamp(resp, wallet), nil
	}
}

// StreamServerInterceptor checks (and, for methods in WithDebitMethods, debits) the budget of
// the streaming methods configured with WithStreamRequest (AgentRunnerService/Deliver by
// default). It receives the request itself (ss.RecvMsg), decides, and answers a rejection
// without calling the handler: with one SendMsg of the Rejecter's response and a nil error,
// or with codes.ResourceExhausted. Otherwise the handler gets a wrapped stream whose first
// RecvMsg returns the request (proto.Merge into the handler's message) and later ones io.EOF
// (server-streaming) or the real stream's next messages (client-streaming), whose Context
// carries the post-debit wallet (FromContext), and whose SendMsg puts that wallet into
// ack.wallet of any message with an "ack" field of type handoff.v1.Ack
// (DeliverResponse{ack}) when the handler left it unset.
//
// It composes with validate.StreamServerInterceptor placed before it: validate receives the
// request and replays it, budget receives that replay. Streaming methods that are not
// configured pass through, but a message carrying a handoff package fails RecvMsg with
// codes.Internal (a package is never let through unchecked); so does one in a later message
// of a configured client-streaming method.
func StreamServerInterceptor(w store.Wallets, opts ...Option) grpc.StreamServerInterceptor {
	if w == nil {
		panic("budget: StreamServerInterceptor: nil Wallets")
	}
	o := newOptions(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		newReq, ok := o.streamReqs[info.FullMethod]
		if !ok {
			return handler(srv, &guardStream{ServerStream: ss, method: info.FullMethod})
		}
		req, err := hop.Receive(ss, newReq())
		if err != nil {
			return err
		}
		bs := &budgetStream{ReplayStream: hop.NewReplayStream(ss, req, "budget")}
		if info.IsClientStream {
			bs.Rest = &guardStream{ServerStream: ss, method: info.FullMethod}
		}
		fd := hop.PackageField(req.ProtoReflect().Descriptor())
		if fd == nil {
			return handler(srv, bs)
		}
		wallet, reasons, err := o.decide(ss.Context(), w, info.FullMethod, req, fd)
		if err != nil {
			return err
		}
		if len(reasons) > 0 {
			if resp, ok := o.Reject(info.FullMethod, req, reasons); ok {
				return ss.SendMsg(resp)
			}
			return exhausted(reasons)
		}
		bs.wallet = wallet
		return handler(srv, bs)
	}
}

// decide checks the budget of the package in m's field fd. It returns the wallet after a
// debit (nil when nothing was debited) or the reasons for a rejection (request-relative), or
// an error (a gRPC status) when the store failed.
func (o *options) decide(ctx context.Context, w store.Wallets, method string, m proto.Message, fd protoreflect.FieldDescriptor) (*handoffv1.Budget, []*handoffv1.Reason, error) {
	r := m.ProtoReflect()
	if !r.Has(fd) {
		return nil, nil, status.Errorf(codes.InvalidArgument, "%s is required (budget check)", fd.Name())
	}
	pkg, err := hop.AsPackage(r.Get(fd).Message())
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "budget: reading the package: %v", err)
	}
	wallet, reasons, err := check(ctx, w, pkg, o.debit[method])
	if err != nil {
		return nil, nil, err
	}
	for i, x := range reasons {
		reasons[i] = hop.Under(string(fd.Name()), x)
	}
	return wallet, reasons, nil
}

// check is decide for one package; reasons are relative to the package.
func check(ctx context.Context, w store.Wallets, pkg *handoffv1.HandoffPackage, debit bool) (*handoffv1.Budget, []*handoffv1.Reason, error) {
	b := pkg.GetBudget()
	id, job := b.GetWalletId(), pkg.GetJobId()
	if id == "" {
		return nil, emptyParts(b, "the job's wallet"), nil
	}
	if !debit {
		cur, err := w.WalletFor(ctx, id, job)
		switch {
		case err == nil:
			// What Deliver's admission would refuse first: a silent reset.
			if v, ok := w.(store.Verdicts); ok {
				reset, err := v.ResetsVerdict(ctx, id, job, pkg.GetEvaluator().GetLastVerdict())
				if err != nil {
					return nil, nil, storeError(err)
				}
				if reset {
					return nil, []*handoffv1.Reason{resetReason(pkg)}, nil
				}
			}
			return nil, emptyParts(cur, fmt.Sprintf("wallet %q", id)), nil
		case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrWrongJob):
			return nil, notJobs(id, job), nil
		}
		return nil, nil, storeError(err)
	}
	var after, held *handoffv1.Budget
	var err error
	if d, ok := DebitedFrom(ctx); ok && d.WalletID == id {
		after, err = d.Wallet, d.Err // already debited (or refused) with the claim
		if errors.Is(err, store.ErrWalletEmpty) {
			after, held = nil, d.Wallet
		}
	} else {
		after, err = w.Debit(ctx, id, HopFor(job))
	}
	switch {
	case err == nil:
		after = proto.Clone(after).(*handoffv1.Budget)
		after.WalletId = id
		return after, nil, nil
	case errors.Is(err, store.ErrWalletEmpty):
		// The debit checked the job first: this is the package's own job's wallet.
		cur := held
		if cur == nil {
			if cur, err = w.WalletFor(ctx, id, job); err != nil {
				return nil, nil, storeError(err)
			}
		}
		reasons := emptyParts(cur, fmt.Sprintf("wallet %q", id))
		if len(reasons) == 0 { // not for lack of hops or money: say so as a whole
			reasons = []*handoffv1.Reason{{Field: "budget", Rule: RuleEmpty,
				Message: fmt.Sprintf("wallet %q cannot cover one hop", id)}}
		}
		return nil, reasons, nil
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrWrongJob):
		return nil, notJobs(id, job), nil
	case errors.Is(err, store.ErrSilentReset):
		return nil, []*handoffv1.Reason{resetReason(pkg)}, nil
	}
	return nil, nil, storeError(err)
}

// resetReason names what a package that resets a failed verdict got wrong.
func resetReason(pkg *handoffv1.HandoffPackage) *handoffv1.Reason {
	msg := "a judge failed this job and the package carries no evaluator.last_verdict: a stage may not start as if the FAIL had not happened"
	if pkg.GetEvaluator().GetLastVerdict() == handoffv1.Verdict_VERDICT_PASS {
		msg = "the package claims a PASS no judge gave: the job's last recorded verdict is not PASS"
	}
	return &handoffv1.Reason{Field: FieldVerdict, Rule: RuleReset, Message: msg}
}

// notJobs is the reason for a wallet_id that is not a wallet of the package's job in this
// store: unknown, another job's, or one that records no job, in the same words, naming only
// what the package said.
func notJobs(id, job string) []*handoffv1.Reason {
	return []*handoffv1.Reason{{Field: FieldWallet, Rule: RuleWallet,
		Message: fmt.Sprintf("wallet %q is not a wallet of job %q in this runner's store: a package pays only from its own job's wallet", id, job)}}
}

// emptyParts names each empty part of b (no money, no hops).
func emptyParts(b *handoffv1.Budget, whose string) []*handoffv1.Reason {
	var out []*handoffv1.Reason
	if b.GetUsdRemainingMicros() <= 0 {
		out = append(out, &handoffv1.Reason{Field: FieldMoney, Rule: RuleEmpty, Message: "no money left in " + whose})
	}
	if b.GetHopsRemaining() == 0 {
		out = append(out, &handoffv1.Reason{Field: FieldHops, Rule: RuleEmpty, Message: "no hops left in " + whose})
	}
	return out
}

func storeError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Unavailable, "wallet store: %v", err)
}

// exhausted is the error for a rejection nobody answered: codes.ResourceExhausted listing
// "field: message" pairs, with a google.rpc.QuotaFailure detail (subject = field).
func exhausted(reasons []*handoffv1.Reason) error {
	parts := make([]string, 0, len(reasons))
	vs := make([]*errdetails.QuotaFailure_Violation, 0, len(reasons))
	for _, r := range reasons {
		parts = append(parts, fmt.Sprintf("%s: %s", r.GetField(), r.GetMessage()))
		vs = append(vs, &errdetails.QuotaFailure_Violation{Subject: r.GetField(), Description: r.GetMessage()})
	}
	st := status.New(codes.ResourceExhausted, "budget exhausted: "+strings.Join(parts, "; "))
	if d, err := st.WithDetails(&errdetails.QuotaFailure{Violations: vs}); err == nil {
		st = d
	}
	return st.Err()
}

// budgetStream hands the handler the request the interceptor already received, the wallet in
// its context, and stamps the wallet into the Acks it sends.
type budgetStream struct {
	*hop.ReplayStream
	wallet *handoffv1.Budget // nil: nothing debited
}

func (s *budgetStream) Context() context.Context {
	ctx := s.ServerStream.Context() // asked each time: outer wrappers may update theirs
	if s.wallet != nil {
		ctx = context.WithValue(ctx, ctxKey{}, s.wallet)
	}
	return ctx
}

func (s *budgetStream) SendMsg(m any) error {
	if s.wallet != nil {
		m = stamp(m, s.wallet)
	}
	return s.ServerStream.SendMsg(m)
}

// guardStream refuses stream messages carrying a package the interceptor did not check.
type guardStream struct {
	grpc.ServerStream
	method string
}

func (s *guardStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok && hop.PackageField(pm.ProtoReflect().Descriptor()) != nil {
		return status.Errorf(codes.Internal,
			"budget: %s: this stream message carries a handoff package the budget interceptor did not check "+
				"(only the first message of a method configured with WithStreamRequest is checked)", s.method)
	}
	return nil
}

// stamp returns m with wallet in its ack.wallet when m has a set "ack" field of type
// handoff.v1.Ack whose wallet is unset (a copy of m: the handler's message is not modified);
// otherwise m itself.
func stamp(m any, wallet *handoffv1.Budget) any {
	pm, ok := m.(proto.Message)
	if !ok || pm == nil {
		return m
	}
	r := pm.ProtoReflect()
	if !r.IsValid() {
		return m
	}
	fd := hop.AckField(r.Descriptor())
	if fd == nil || !r.Has(fd) {
		return m
	}
	if ack, ok := r.Get(fd).Message().Interface().(*handoffv1.Ack); !ok || ack.GetWallet() != nil {
		return m
	}
	c := proto.Clone(pm)
	ack := c.ProtoReflect().Get(fd).Message().Interface().(*handoffv1.Ack)
	ack.Wallet = proto.Clone(wallet).(*handoffv1.Budget)
	return c
}

// PackageAckRejecter answers a budget rejection of AgentRunnerService Deliver or Check with a
// REJECTED_BUDGET Ack: Deliver gets DeliverResponse{ack} (the one message of the stream),
// Check gets CheckResponse{ack}. The Ack is contract.AckFor(package, REJECTED_BUDGET,
// reasons...) with the reasons renamed relative to the package ("budget.hops_remaining",
// rule "budget.empty"); ack.wallet is nil (nothing was debited). It declines for any other
// method.
//
// A silent reset (rule RuleReset, field evaluator.last_verdict) is answered REJECTED_SCHEMA
// instead: it is found in the same store round trip as the hop's debit, but it is the
// package, not the wallet, that is wrong.
func PackageAckRejecter() Rejecter {
	budgetAck := hop.AckRejecter(handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, nil)
	schemaAck := hop.AckRejecter(handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, nil)
	return func(fullMethod string, req proto.Message, reasons []*handoffv1.Reason) (proto.Message, bool) {
		for _, r := range reasons {
			if r.GetRule() == RuleReset {
				return schemaAck(fullMethod, req, reasons)
			}
		}
		return budgetAck(fullMethod, req, reasons)
	}
}
