package agentrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/budget"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/store"
)

// Interceptors returns the runner's enforcement (step 6 of the rpc chain), outermost first.
// The first interceptor that refuses a package answers it, and nothing after it runs:
//
//  0. version (version.go): a package of a version the agent does not declare ->
//     REJECTED_SCHEMA naming it; a handoff.v2 package is checked, its budget.deadline
//     enforced (REJECTED_BUDGET), and its v1 view handed on, so the steps below are the
//     same for both versions.
//  1. validate (schema; validate.PackageAckRejecter): first, because every later step reads
//     the package (the stage, the completion key, the wallet id) and may only read a valid
//     one. A broken package -> REJECTED_SCHEMA Ack, one reason per broken rule; a malformed
//     agent or required_tools with a valid package -> InvalidArgument.
//  2. role (this package): before anything touches the store, so a misrouted package claims
//     no key and pays no hop, and Deliver and Check agree on it. The agent is req.agent, or
//     the package's stage when empty; none registered -> REJECTED_ROLE (field
//     "agent"/"stage", rule "role.agent"); a required_tools entry the agent's role card
//     lacks -> REJECTED_ROLE, one reason per missing tool (field "required_tools[i]", rule
//     "role.tools"). An accepted package carries its agent to the handler in the context.
//  3. idempotency (Deliver only; key VisitKey(job_id, stage, evaluator.rounds,
//     operator_returns, visit)):
//     before budget on purpose. A re-delivery of a completed stage is answered DUPLICATE
//     with the stored PriorResult, and one still in flight gets gRPC Aborted, without
//     paying a second hop: when the same wallet paid the first completion, the replayed
//     Ack carries that wallet (the hop is paid); otherwise (another run of the job) it
//     carries none and the coordinator debits that hop itself, exactly once. A COMPLETED
//     StageResult is recorded (done) just after it is sent (WithStreamRecordAfterSend); a
//     FAILED StageResult or any Ack other than ACCEPTED (a budget rejection below)
//     releases the claim before it is sent, so a later delivery runs the stage. The
//     claim is short (ClaimTTL, 3s) and renewed every third of it while the agent works
//     (WithClaimRenewal), the work bounded by StageTimeout plus a slack: a runner killed
//     mid-stage frees the stage within ClaimTTL, and the retry runs elsewhere.
//  4. budget (Deliver debits one hop from the wallet in the store and stamps ack.wallet;
//     Check only reads it): last, so only a package that will really run (valid, routed,
//     not done, not in flight) pays. An empty wallet -> REJECTED_BUDGET (rule
//     "budget.empty"); a wallet_id that is not a wallet of the package's job in this
//     store (unknown, another job's) -> REJECTED_BUDGET (field "budget.wallet_id", rule
//     "budget.wallet"), checked in the same Admit as the claim. So is a silent reset: after
//     a FAIL recorded for the wallet, a package without evaluator.last_verdict or claiming
//     a PASS no judge gave -> REJECTED_SCHEMA (field "evaluator.last_verdict", rule
//     "evaluator.reset"), also when its completion key is done (an earlier round's). Either
//     way the agent is not called and the claim above is released.
//
// Then the handler: Deliver sends ACCEPTED and runs the agent; Check looks the completion
// key up (DUPLICATE / Aborted / ACCEPTED). Check's chain is the same without step 3.
func (s *Server) Interceptors() ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	return slices.Clone(s.unary), slices.Clone(s.stream)
}

func (s *Server) buildInterceptors() ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	vopts := []validate.Option{validate.WithRejecter(s.logged(validate.PackageAckRejecter()))}
	bopts := []budget.Option{budget.WithRejecter(s.logged(budget.PackageAckRejecter()))}
	// The version gate (version.go) decides which versions are read; validate then checks
	// the rules of whatever it let in, so it accepts every version.
	unary := []grpc.UnaryServerInterceptor{
		s.versionUnary,
		validate.UnaryServerInterceptor(s.all, vopts...),
		s.roleUnary,
		budget.UnaryServerInterceptor(s.st, bopts...),
	}
	stream := []grpc.StreamServerInterceptor{
		s.versionStream,
		validate.StreamServerInterceptor(s.all, vopts...),
		s.roleStream,
		idempotency.StreamServerInterceptor(s.st,
			idempotency.WithStreamKey(handoffv1.AgentRunnerService_Deliver_FullMethodName,
				func() proto.Message { return &handoffv1.DeliverRequest{} }, deliverKey),
			idempotency.WithStreamReplay(handoffv1.AgentRunnerService_Deliver_FullMethodName, s.replay),
			idempotency.WithStreamRecord(handoffv1.AgentRunnerService_Deliver_FullMethodName, s.record),
			idempotency.WithStreamClaim(handoffv1.AgentRunnerService_Deliver_FullMethodName, s.admit),
			// The coordinator saves a result with its run before acting on it, so the
			// completion is stored while the result travels (and the coordinator saves),
			// not ahead of it: one store round trip less on every hop's path.
			idempotency.WithStreamRecordAfterSend(handoffv1.AgentRunnerService_Deliver_FullMethodName),
			idempotency.WithPendingTTL(s.claimTTL),
			idempotency.WithClaimRenewal(s.timeout+workSlack),
			idempotency.WithResultTTL(s.resultTTL),
			idempotency.WithLogger(s.log),
		),
		budget.StreamServerInterceptor(s.st, bopts...),
	}
	return unary, stream
}

// ---- role ----

type agentKey struct{}

// agentFrom returns the agent the role interceptor chose for this call.
func agentFrom(ctx context.Context) (Agent, bool) {
	ag, ok := ctx.Value(agentKey{}).(Agent)
	return ag, ok && ag != nil
}

// request is what Deliver and Check have in common.
type request interface {
	GetPackage() *handoffv1.HandoffPackage
	GetAgent() string
	GetRequiredTools() []string
}

// role is gate (b): the REJECTED_ROLE Ack, or nil and the agent that will serve the package.
func (s *Server) role(req request) (*handoffv1.Ack, Agent) {
	p := req.GetPackage()
	name, field := req.GetAgent(), "agent"
	if name == "" {
		name, field = p.GetStage(), "stage"
	}
	ag, ok := s.agents[name]
	if !ok {
		return contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, &handoffv1.Reason{
			Field: field, Rule: RuleRoleAgent,
			Message: fmt.Sprintf("no agent %q on this runner", name),
		}), nil
	}
	card := ag.Card()
	var missing []*handoffv1.Reason
	for i, t := range req.GetRequiredTools() {
		if !card.Holds(t) {
			missing = append(missing, &handoffv1.Reason{
				Field: fmt.Sprintf("required_tools[%d]", i), Rule: RuleRoleTools,
				Message: fmt.Sprintf("agent %q does not hold tool %q", name, clip(t, 128)),
			})
		}
	}
	if len(missing) > 0 {
		return contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_REJECTED_ROLE, missing...), nil
	}
	return nil, ag
}

// errNoPackage fails closed when the role interceptor sees no package (validate would have
// answered it: the chain is misassembled).
var errNoPackage = status.Error(codes.InvalidArgument, "package is required")

// roleUnary is the role gate of Check.
func (s *Server) roleUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != handoffv1.AgentRunnerService_Check_FullMethodName {
		return handler(ctx, req)
	}
	r, ok := req.(*handoffv1.CheckRequest)
	if !ok {
		return nil, status.Errorf(codes.Internal, "agentrunner: %s: request is %T", info.FullMethod, req)
	}
	if r.GetPackage() == nil {
		return nil, errNoPackage
	}
	ack, ag := s.role(r)
	if ack != nil {
		s.logAck(ctx, ack, "check")
		return &handoffv1.CheckResponse{Ack: ack}, nil
	}
	return handler(context.WithValue(ctx, agentKey{}, ag), req)
}

// roleStream is the role gate of Deliver: it receives the request itself and answers a
// misrouted package with its REJECTED_ROLE Ack without calling the rest of the chain.
func (s *Server) roleStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != handoffv1.AgentRunnerService_Deliver_FullMethodName {
		return handler(srv, ss)
	}
	m, err := hop.ReceiveRequest(ss, &handoffv1.DeliverRequest{}, info.FullMethod)
	if err != nil {
		return err
	}
	req := m.(*handoffv1.DeliverRequest)
	if req.GetPackage() == nil {
		return errNoPackage
	}
	ack, ag := s.role(req)
	if ack != nil {
		s.logAck(ss.Context(), ack, "deliver")
		return sendAck(ss, ack)
	}
	return handler(srv, newRoutedStream(ss, req, ag))
}

// routedStream hands the next interceptor the request the role gate read (a hop.ReplayStream:
// by reference through hop.Receive, or a copy through RecvMsg), and the chosen agent in its
// context.
type routedStream struct {
	*hop.ReplayStream
	agent Agent
}

func newRoutedStream(ss grpc.ServerStream, req *handoffv1.DeliverRequest, ag Agent) *routedStream {
	return &routedStream{ReplayStream: &hop.ReplayStream{
		ServerStream: ss, First: req, KeepOnRefuse: true,
		Refuse: func(m any) error {
			return status.Errorf(codes.Internal, "agentrunner: Deliver receives into %T, not a DeliverRequest", m)
		},
	}, agent: ag}
}

func (s *routedStream) Context() context.Context {
	return context.WithValue(s.ServerStream.Context(), agentKey{}, s.agent) // outer wrappers may update theirs
}

// ---- idempotency hooks ----

func deliverKey(req proto.Message) (string, error) {
	r, ok := req.(*handoffv1.DeliverRequest)
	if !ok || r.GetPackage() == nil {
		return "", errors.New("package is required")
	}
	p := r.GetPackage()
	return packageKey(p), nil
}

// replay answers a re-delivery of a completed stage: DUPLICATE carrying the stored result.
// When the first completion was paid from the same wallet, the ack carries that wallet as
// it stands: the hop is paid, and the sender must not debit it a second time.
func (s *Server) replay(req proto.Message, stored []byte) (proto.Message, error) {
	p := req.(*handoffv1.DeliverRequest).GetPackage()
	ack, err := duplicateAck(p, stored)
	if err != nil {
		return nil, err
	}
	if id := ack.GetPrior().GetWalletId(); id != "" && id == p.GetBudget().GetWalletId() {
		// Only the package's own job's wallet is shown (a completion recorded before wallets
		// recorded their job may name any).
		if w, err := s.st.WalletFor(context.Background(), id, p.GetJobId()); err == nil {
			w.WalletId = id
			ack.Wallet = w
		}
	}
	s.logAck(context.Background(), ack, "deliver")
	return &handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}, nil
}

// record settles the completion key by what Deliver sends: a COMPLETED result is stored as the
// PriorResult a re-delivery replays; a FAILED result, or an Ack that is not ACCEPTED (the
// budget interceptor's REJECTED_BUDGET), releases the claim; an ACCEPTED Ack leaves it open.
// admit claims a delivery's completion key and debits its hop from the job's wallet in one
// store round trip (store.Admitter), and hands the debit to the budget interceptor, which
// runs next, through the context (budget.WithDebited). The budget interceptor still
// decides what a refused or missing wallet means; a key that is Pending or Done debits
// nothing.
func (s *Server) admit(ctx context.Context, req proto.Message, key string, ttl time.Duration) (store.ClaimState, []byte, string, func(context.Context) context.Context, error) {
	p := req.(*handoffv1.DeliverRequest).GetPackage()
	id := p.GetBudget().GetWalletId()
	// Paid by the package's job: a wallet of another job is refused in the same round trip,
	// and so is a package that resets the job's failed verdict (store.ErrSilentReset).
	d := budget.HopFor(p.GetJobId())
	d.CheckVerdict, d.Verdict = true, p.GetEvaluator().GetLastVerdict()
	a, err := s.st.Admit(ctx, key, ttl, id, d)
	if err == nil && a.State == store.Done && errors.Is(a.DebitErr, store.ErrSilentReset) {
		// A reset package names an earlier round's completion key: it is refused, not
		// answered with that round's result. Going on as claimed lets the budget step
		// refuse it; the release after the refusal leaves a done record alone. It holds no
		// claim of the store's, so its token matches none: were anything to Complete the
		// key under it, the store would refuse (ErrNotOwner: done with another value).
		a.State, a.Value, a.Owner = store.Claimed, nil, "no-claim:silent-reset"
	}
	if err != nil || a.State != store.Claimed {
		return a.State, a.Value, a.Owner, nil, err
	}
	// The agent shares the request (hop.Receive): what the stage is settled under after it
	// runs is taken now, before it could change the package.
	ad := admitted{walletID: id, jobID: p.GetJobId(), key: key}
	debited := budget.Debited{WalletID: id, Err: a.DebitErr, Wallet: a.Wallet}
	return a.State, a.Value, a.Owner, func(c context.Context) context.Context {
		c = context.WithValue(c, admittedKey{}, ad)
		if id != "" { // a package with a wallet was debited with its claim
			c = budget.WithDebited(c, debited)
		}
		return c
	}, nil
}

// admitted is what a delivery was claimed and paid under: its package's wallet and job and
// its completion key, as they were when the claim was made.
type admitted struct{ walletID, jobID, key string }

type admittedKey struct{}

// admittedOf returns what the delivery of req was admitted under (admit), or, for a call
// that was not (no claim hook), what req says.
func admittedOf(ctx context.Context, req *handoffv1.DeliverRequest) (admitted, error) {
	if a, ok := ctx.Value(admittedKey{}).(admitted); ok {
		return a, nil
	}
	key, err := deliverKey(req)
	return admitted{walletID: req.GetPackage().GetBudget().GetWalletId(), jobID: req.GetPackage().GetJobId(), key: key}, err
}

// unpay undoes the "paid" mark of a delivery whose agent ran and failed: the claim is
// released, and a new attempt at the stage is a new hop, charged again. A delivery retried
// because the runner or the caller went away (no result) stays paid and is not charged
// twice. A failed Unpay only means the next attempt is free; it is logged.
func (s *Server) unpay(ctx context.Context, req *handoffv1.DeliverRequest) {
	a, err := admittedOf(ctx, req)
	id := a.walletID
	d, ok := budget.DebitedFrom(ctx)
	if id == "" || !ok || d.WalletID != id || d.Err != nil {
		return
	}
	if err == nil {
		err = s.st.Unpay(ctx, id, a.key)
	}
	if err != nil {
		s.log.Warn("agentrunner: could not unmark a failed stage's hop as paid; its next attempt is not charged", "wallet_id", id, "err", err)
	}
}

func (s *Server) record(ctx context.Context, req proto.Message, sent proto.Message) (value []byte, done, failed bool) {
	m, ok := sent.(*handoffv1.DeliverResponse)
	if !ok {
		return nil, false, false
	}
	switch ev := m.GetEvent().(type) {
	case *handoffv1.DeliverResponse_Ack:
		return nil, false, ev.Ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED
	case *handoffv1.DeliverResponse_Result:
		res := ev.Result
		if res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
			s.unpay(ctx, req.(*handoffv1.DeliverRequest))
			return nil, false, true
		}
		prior := &handoffv1.PriorResult{
			Artifacts:   res.GetArtifacts(),
			Evaluator:   res.GetEvaluator(),
			NextHint:    res.GetNextHint(),
			Route:       res.GetRoute(), // a replayed job takes the route it took the first time
			CompletedAt: timestamppb.Now(),
		}
		// Deliver debits the hop whenever the package's wallet is in this store (budget
		// step): remember which wallet paid, so a re-delivery from it is not charged again.
		a, _ := admittedOf(ctx, req.(*handoffv1.DeliverRequest))
		if id := a.walletID; id != "" {
			if d, ok := budget.DebitedFrom(ctx); ok && d.WalletID == id {
				if d.Err == nil {
					prior.WalletId = id // debited with the claim: no need to ask the store
				}
			} else if _, err := s.st.WalletFor(ctx, id, a.jobID); err == nil {
				prior.WalletId = id
			}
		}
		value, err := proto.Marshal(prior)
		if err != nil {
			s.log.Error("agentrunner: encoding the completion failed; the claim is released", "job_id", res.GetJobId(), "stage", res.GetStage(), "err", err)
			return nil, false, true
		}
		return value, true, false
	}
	return nil, false, false
}

// ---- logging ----

// logged wraps a rejecter (validate's or budget's) so that every Ack it answers with is
// logged like the runner's own.
func (s *Server) logged(r validate.Rejecter) validate.Rejecter {
	return func(fullMethod string, req proto.Message, reasons []*handoffv1.Reason) (proto.Message, bool) {
		resp, ok := r(fullMethod, req, reasons)
		if ok {
			var ack *handoffv1.Ack
			switch m := resp.(type) {
			case *handoffv1.DeliverResponse:
				ack = m.GetAck()
			case *handoffv1.CheckResponse:
				ack = m.GetAck()
			}
			if ack != nil {
				s.logAck(context.Background(), ack, strings.ToLower(path.Base(fullMethod)))
			}
		}
		return resp, ok
	}
}

func (s *Server) logAck(ctx context.Context, ack *handoffv1.Ack, rpc string) {
	if !s.log.Enabled(ctx, slog.LevelInfo) {
		return // the line's attributes are built only when it is written
	}
	attrs := []any{"rpc", rpc, "job_id", ack.GetJobId(), "stage", ack.GetStage(), "status", ack.GetStatus().String()}
	if len(ack.GetReasons()) > 0 {
		r := ack.GetReasons()[0]
		attrs = append(attrs, "reasons", len(ack.GetReasons()), "field", r.GetField(), "rule", r.GetRule())
	}
	if w := ack.GetWallet(); w != nil {
		attrs = append(attrs, "wallet_id", w.GetWalletId(), "hops_left", w.GetHopsRemaining())
	}
	s.log.InfoContext(ctx, "agentrunner: ack", attrs...)
}

func sendAck(ss grpc.ServerStream, ack *handoffv1.Ack) error {
	return ss.SendMsg(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}})
}
