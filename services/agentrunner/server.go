// Package agentrunner hosts stage agents behind handoff.v1.AgentRunnerService.
//
// Every package is answered with an Ack before any agent work: a package that is malformed,
// misrouted, over budget or already done costs no agent call. Accepted packages run their
// agent once per completion key; the result is recorded in the idempotency store, so a
// re-delivered package gets the first result back (DUPLICATE) instead of a second run.
package agentrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/store"
)

// DefaultStageTimeout bounds one agent run when Options.StageTimeout is zero.
const DefaultStageTimeout = 60 * time.Second

// Rule ids of the reasons this runner emits itself (schema reasons come from contract).
const (
	RuleRoleAgent   = "role.agent"   // no agent is registered under the requested name
	RuleRoleTools   = "role.tools"   // the agent's role card lacks a required tool
	RuleBudgetEmpty = "budget.empty" // money or hops left is zero
)

// Options configure a Server.
type Options struct {
	// Validator checks packages (CheckV1) and results (Validate). nil builds the default
	// (accepting handoff.v1 and handoff.v2).
	Validator *contract.Validator
	// Store records stage completions (required).
	Store store.Idempotency
	// Artifacts is handed to agents to read and write artifacts (required).
	Artifacts artifact.Store
	// Agents served by this runner, addressed by their card names (unique).
	Agents []Agent
	// StageTimeout bounds one agent run (default 60s).
	StageTimeout time.Duration
	// ClaimTTL is how long a pending claim blocks other deliveries of the same stage before
	// it counts as abandoned (a runner that died mid-stage). Default StageTimeout+30s. Keep
	// it above StageTimeout: a shorter TTL lets a re-delivery run a stage that is still
	// running (New logs a warning).
	ClaimTTL time.Duration
	// ResultTTL is how long stage-completion records are kept (0 = forever).
	ResultTTL time.Duration
	// Logger receives one line per package (default slog.Default()).
	Logger *slog.Logger
}

// Server implements handoffv1.AgentRunnerServiceServer.
type Server struct {
	handoffv1.UnimplementedAgentRunnerServiceServer

	v         *contract.Validator
	st        store.Idempotency
	artifacts artifact.Store
	agents    map[string]Agent
	timeout   time.Duration
	claimTTL  time.Duration
	resultTTL time.Duration
	log       *slog.Logger
}

var roleName = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// New builds a Server. It fails on a missing store, artifact store, or an agent whose card
// name is empty, malformed or taken by another agent.
func New(opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("agentrunner: Options.Store is required")
	}
	if opts.Artifacts == nil {
		return nil, errors.New("agentrunner: Options.Artifacts is required")
	}
	v := opts.Validator
	if v == nil {
		var err error
		if v, err = contract.NewValidator(); err != nil {
			return nil, fmt.Errorf("agentrunner: %w", err)
		}
	}
	s := &Server{
		v:         v,
		st:        opts.Store,
		artifacts: opts.Artifacts,
		agents:    make(map[string]Agent, len(opts.Agents)),
		timeout:   opts.StageTimeout,
		claimTTL:  opts.ClaimTTL,
		resultTTL: opts.ResultTTL,
		log:       opts.Logger,
	}
	if s.timeout <= 0 {
		s.timeout = DefaultStageTimeout
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.claimTTL <= 0 {
		s.claimTTL = s.timeout + 30*time.Second
	} else if s.claimTTL <= s.timeout {
		s.log.Warn("agentrunner: ClaimTTL is not longer than StageTimeout; a re-delivery may run a stage that is still running",
			"claim_ttl", s.claimTTL, "stage_timeout", s.timeout)
	}
	if s.resultTTL < 0 {
		s.resultTTL = 0
	}
	for i, a := range opts.Agents {
		if a == nil {
			return nil, fmt.Errorf("agentrunner: Agents[%d] is nil", i)
		}
		name := a.Card().Name
		if len(name) > 64 || !roleName.MatchString(name) {
			return nil, fmt.Errorf("agentrunner: Agents[%d]: card name %q must match %s (at most 64 bytes)", i, name, roleName)
		}
		if _, dup := s.agents[name]; dup {
			return nil, fmt.Errorf("agentrunner: two agents named %q", name)
		}
		s.agents[name] = a
	}
	return s, nil
}

// Agents returns the role cards of the registered agents, by name.
func (s *Server) Agents() map[string]RoleCard {
	out := make(map[string]RoleCard, len(s.agents))
	for n, a := range s.agents {
		out[n] = a.Card()
	}
	return out
}

// Register registers srv's AgentRunnerService on s.
func Register(s grpc.ServiceRegistrar, srv *Server) {
	handoffv1.RegisterAgentRunnerServiceServer(s, srv)
}

// NewGRPCServer returns a gRPC server serving srv, server reflection and the standard health
// service. Health reports SERVING for "" and for handoff.v1.AgentRunnerService; set it to
// NOT_SERVING (hs.Shutdown()) before a graceful stop.
func NewGRPCServer(srv *Server, opts ...grpc.ServerOption) (gs *grpc.Server, hs *health.Server) {
	gs = grpc.NewServer(opts...)
	Register(gs, srv)
	hs = health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(handoffv1.AgentRunnerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, hs
}

// CompletionKey is the idempotency key of one stage completion:
// "stage:<job_id>:<stage>:<round>", round being the number of judge verdicts so far. The
// retry attempt is never part of it: a re-delivery hits the same key, while a revision after
// a judge FAIL (one more verdict) is a new key.
func CompletionKey(jobID, stage string, round uint32) string {
	return fmt.Sprintf("stage:%s:%s:%d", jobID, stage, round)
}

// request is what Deliver and Check have in common.
type request interface {
	GetPackage() *handoffv1.HandoffPackage
	GetAgent() string
	GetRequiredTools() []string
}

// checkRequest rejects a request the runner cannot even ack: no package, or request-level
// fields (agent, required_tools) that break their own rules.
func checkRequest(req request) error {
	if req == nil || req.GetPackage() == nil {
		return status.Error(codes.InvalidArgument, "package is required")
	}
	if a := req.GetAgent(); a != "" && (len(a) > 64 || !roleName.MatchString(a)) {
		return status.Errorf(codes.InvalidArgument, "agent %q must match %s (at most 64 bytes)", clip(a, 80), roleName)
	}
	tools := req.GetRequiredTools()
	if len(tools) > 64 {
		return status.Errorf(codes.InvalidArgument, "required_tools has %d entries, at most 64 allowed", len(tools))
	}
	for i, t := range tools {
		if len(t) > 128 {
			return status.Errorf(codes.InvalidArgument, "required_tools[%d] is longer than 128 bytes", i)
		}
	}
	return nil
}

// gates runs the checks that need no store: (a) schema, (b) role, (c) budget. It returns the
// rejection Ack, or nil and the agent that will serve the package.
func (s *Server) gates(req request) (*handoffv1.Ack, Agent) {
	p := req.GetPackage()
	// (a) schema: version gate and protovalidate rules; nothing else is read before it.
	if reasons := s.v.CheckV1(p); len(reasons) > 0 {
		return contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, reasons...), nil
	}
	// (b) role: an agent must be registered under the requested name and hold every tool
	// the pipeline assigns to the stage.
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
	// (c) budget: an empty wallet (money or hops) stops the job here, not after the agent.
	var empty []*handoffv1.Reason
	if p.GetBudget().GetUsdRemainingMicros() == 0 {
		empty = append(empty, &handoffv1.Reason{
			Field: "budget.usd_remaining_micros", Rule: RuleBudgetEmpty, Message: "no money left in the job's wallet",
		})
	}
	if p.GetBudget().GetHopsRemaining() == 0 {
		empty = append(empty, &handoffv1.Reason{
			Field: "budget.hops_remaining", Rule: RuleBudgetEmpty, Message: "no hops left for this job",
		})
	}
	if len(empty) > 0 {
		return contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_REJECTED_BUDGET, empty...), nil
	}
	return nil, ag
}

// duplicateAck decodes a stored completion into a DUPLICATE Ack.
func duplicateAck(p *handoffv1.HandoffPackage, value []byte) (*handoffv1.Ack, error) {
	prior := &handoffv1.PriorResult{}
	if err := proto.Unmarshal(value, prior); err != nil {
		return nil, status.Errorf(codes.Internal, "stored completion is unreadable: %v", err)
	}
	ack := contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_DUPLICATE)
	ack.Prior = prior
	return ack, nil
}

func inFlight(key string) error {
	return status.Errorf(codes.Aborted, "stage %s is in flight on another delivery; retry later", key)
}

// Deliver answers a package. The first message is always the Ack, decided by these gates in
// this order (the first that fails decides; a rejected package never reaches an agent):
//
//	(a) schema: contract CheckV1 (version gate + protovalidate) -> REJECTED_SCHEMA with one
//	    reason per broken rule;
//	(b) role: the agent is req.agent, or the package's stage when empty; none registered ->
//	    REJECTED_ROLE (field "agent"/"stage", rule "role.agent"); a req.required_tools entry
//	    missing from the agent's role card -> REJECTED_ROLE, one reason per missing tool
//	    (field "required_tools[i]", rule "role.tools");
//	(c) budget: budget.usd_remaining_micros == 0 or budget.hops_remaining == 0 ->
//	    REJECTED_BUDGET naming each empty field (rule "budget.empty");
//	(d) duplicate: claim CompletionKey(job_id, stage, evaluator.rounds) in the store:
//	    Done -> DUPLICATE carrying the stored PriorResult, and the stream ends;
//	    Pending -> no Ack: gRPC Aborted (the stage is in flight; retry later);
//	    Claimed -> ACCEPTED, the agent runs (bounded by the stage timeout), the completion is
//	    recorded, then one StageResult follows. A failed run (error, timeout, panic, invalid
//	    result) sends a STAGE_STATUS_FAILED result and releases the claim so a retry runs
//	    the stage again.
//
// A request without a package, or with malformed agent/required_tools, is InvalidArgument.
//
// Once accepted, the agent run is detached from the caller's cancellation (it keeps the
// context's values): a caller that hangs up does not waste the work, which is recorded and
// returned as DUPLICATE to the retry.
func (s *Server) Deliver(req *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	if err := checkRequest(req); err != nil {
		return err
	}
	ctx := stream.Context()
	ack, ag := s.gates(req)
	if ack != nil {
		s.logAck(ctx, ack, "deliver")
		return sendAck(stream, ack)
	}
	return s.deliverAccepted(ctx, req, ag, stream)
}

func (s *Server) deliverAccepted(ctx context.Context, req *handoffv1.DeliverRequest, ag Agent, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	p := req.GetPackage()
	round := p.GetEvaluator().GetRounds()
	key := CompletionKey(p.GetJobId(), p.GetStage(), round)
	state, value, err := s.st.Claim(ctx, key, s.claimTTL)
	if err != nil {
		s.log.ErrorContext(ctx, "agentrunner: claim failed", "job_id", p.GetJobId(), "stage", p.GetStage(), "key", key, "err", err)
		return status.Errorf(codes.Unavailable, "idempotency store: %v", err)
	}
	switch state {
	case store.Done:
		ack, err := duplicateAck(p, value)
		if err != nil {
			return err
		}
		s.logAck(ctx, ack, "deliver")
		return sendAck(stream, ack)
	case store.Pending:
		s.log.InfoContext(ctx, "agentrunner: stage in flight", "job_id", p.GetJobId(), "stage", p.GetStage(), "round", round, "status", "IN_FLIGHT")
		return inFlight(key)
	case store.Claimed:
	default:
		return status.Errorf(codes.Internal, "idempotency store: unexpected claim state %v", state)
	}

	// From here the key is ours: every path must Complete or Release it.
	ack := contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	s.logAck(ctx, ack, "deliver")
	if err := sendAck(stream, ack); err != nil {
		s.release(ctx, key)
		return err
	}

	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	start := time.Now()
	res, runErr := s.run(runCtx, ag, Input{Package: p, Round: round, Artifacts: s.artifacts})
	if runErr == nil {
		runErr = s.finish(p, res)
	}
	if runErr != nil {
		s.release(runCtx, key)
		failed := &handoffv1.StageResult{
			JobId: p.GetJobId(), Stage: p.GetStage(),
			Status:      handoffv1.StageStatus_STAGE_STATUS_FAILED,
			Error:       clip(runErr.Error(), 2000),
			Traceparent: p.GetTrace().GetTraceparent(),
		}
		// What a failed run still spent travels with the failure, so the wallet stays honest.
		var re *RunError
		if errors.As(runErr, &re) {
			failed.SpentUsdMicros = max(re.SpentUsdMicros, 0)
			failed.ToolsTried = s.validTools(re.ToolsTried)
		} else if res != nil {
			failed.SpentUsdMicros = max(res.GetSpentUsdMicros(), 0)
			failed.ToolsTried = s.validTools(res.GetToolsTried())
		}
		s.log.WarnContext(ctx, "agentrunner: stage failed", "job_id", p.GetJobId(), "stage", p.GetStage(), "round", round,
			"agent", ag.Card().Name, "status", failed.Status.String(), "duration", time.Since(start), "err", runErr)
		return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: failed}})
	}

	prior := &handoffv1.PriorResult{
		Artifacts:   res.GetArtifacts(),
		Evaluator:   res.GetEvaluator(),
		NextHint:    res.GetNextHint(),
		CompletedAt: timestamppb.Now(),
	}
	value, err = proto.Marshal(prior)
	if err == nil {
		err = s.st.Complete(runCtx, key, value, s.resultTTL)
	}
	if err != nil {
		// The work is done but not recorded: report it as failed (with what it spent) and free
		// the key, so the rail does not move on from a stage a duplicate could not replay.
		s.release(runCtx, key)
		s.log.ErrorContext(ctx, "agentrunner: recording completion failed", "job_id", p.GetJobId(), "stage", p.GetStage(), "key", key, "err", err)
		failed := &handoffv1.StageResult{
			JobId: p.GetJobId(), Stage: p.GetStage(),
			Status:         handoffv1.StageStatus_STAGE_STATUS_FAILED,
			Error:          clip("stage ran but its completion could not be recorded: "+err.Error(), 2000),
			SpentUsdMicros: res.GetSpentUsdMicros(),
			Traceparent:    p.GetTrace().GetTraceparent(),
		}
		return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: failed}})
	}
	s.log.InfoContext(ctx, "agentrunner: stage completed", "job_id", p.GetJobId(), "stage", p.GetStage(), "round", round,
		"agent", ag.Card().Name, "status", res.GetStatus().String(), "artifacts", len(res.GetArtifacts()),
		"spent_usd_micros", res.GetSpentUsdMicros(), "duration", time.Since(start))
	return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: res}})
}

// Check answers with the Ack Deliver would send first and does no work: gates (a)-(c), then a
// lookup (not a claim) of the completion key: Done -> DUPLICATE with the prior result,
// Pending -> gRPC Aborted (as Deliver), no record -> ACCEPTED.
func (s *Server) Check(ctx context.Context, req *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	p := req.GetPackage()
	ack, _ := s.gates(req)
	if ack == nil {
		key := CompletionKey(p.GetJobId(), p.GetStage(), p.GetEvaluator().GetRounds())
		state, value, err := s.st.Lookup(ctx, key)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "idempotency store: %v", err)
		}
		switch state {
		case store.Done:
			if ack, err = duplicateAck(p, value); err != nil {
				return nil, err
			}
		case store.Pending:
			return nil, inFlight(key)
		default:
			ack = contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
		}
	}
	s.logAck(ctx, ack, "check")
	return &handoffv1.CheckResponse{Ack: ack}, nil
}

// validTools keeps the tool attempts that pass their own rules (at most 64), for a FAILED
// result built from what a failed agent left.
func (s *Server) validTools(ts []*handoffv1.ToolAttempt) []*handoffv1.ToolAttempt {
	var out []*handoffv1.ToolAttempt
	for _, t := range ts {
		if t != nil && len(out) < 64 && s.v.Validate(t) == nil {
			out = append(out, t)
		}
	}
	return out
}

// run calls the agent, turning a panic, a nil result and an overrun of the stage timeout
// into errors. An agent that ignores ctx is abandoned at the deadline (its goroutine ends
// whenever it returns).
func (s *Server) run(ctx context.Context, ag Agent, in Input) (*handoffv1.StageResult, error) {
	type outcome struct {
		res *handoffv1.StageResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		defer func() {
			if r := recover(); r != nil {
				s.log.Error("agentrunner: agent panicked", "agent", ag.Card().Name, "panic", r, "stack", string(debug.Stack()))
				o = outcome{err: fmt.Errorf("agent %s panicked: %v", ag.Card().Name, r)}
			}
			done <- o
		}()
		o.res, o.err = ag.Run(ctx, in)
	}()
	select {
	case o := <-done:
		if o.err != nil {
			if ctx.Err() != nil && errors.Is(o.err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("agent %s: stage timeout after %s: %w", ag.Card().Name, s.timeout, o.err)
			}
			return nil, fmt.Errorf("agent %s: %w", ag.Card().Name, o.err)
		}
		if o.res == nil {
			return nil, fmt.Errorf("agent %s returned no result", ag.Card().Name)
		}
		return o.res, nil
	case <-ctx.Done():
		select {
		case o := <-done: // finished at the deadline: still usable
			if o.err == nil && o.res != nil {
				return o.res, nil
			}
		default:
		}
		return nil, fmt.Errorf("agent %s: stage timeout after %s", ag.Card().Name, s.timeout)
	}
}

// finish fills what the agent left empty (job_id, stage, traceparent, status COMPLETED) and
// refuses a result the rail could not use: one for another job or stage, one the agent
// marked FAILED, or one that breaks the StageResult rules.
func (s *Server) finish(p *handoffv1.HandoffPackage, res *handoffv1.StageResult) error {
	if res.JobId == "" {
		res.JobId = p.GetJobId()
	} else if res.JobId != p.GetJobId() {
		return fmt.Errorf("agent result names job_id %q, package is %q", clip(res.JobId, 128), p.GetJobId())
	}
	if res.Stage == "" {
		res.Stage = p.GetStage()
	} else if res.Stage != p.GetStage() {
		return fmt.Errorf("agent result names stage %q, package is %q", clip(res.Stage, 64), p.GetStage())
	}
	if res.Traceparent == "" {
		res.Traceparent = p.GetTrace().GetTraceparent()
	}
	switch res.Status {
	case handoffv1.StageStatus_STAGE_STATUS_UNSPECIFIED:
		res.Status = handoffv1.StageStatus_STAGE_STATUS_COMPLETED
	case handoffv1.StageStatus_STAGE_STATUS_FAILED:
		msg := res.GetError()
		if msg == "" {
			msg = "no error given"
		}
		return fmt.Errorf("agent reported failure: %s", msg)
	}
	if err := s.v.Validate(res); err != nil {
		return fmt.Errorf("agent result is invalid: %w", err)
	}
	return nil
}

func (s *Server) release(ctx context.Context, key string) {
	if err := s.st.Release(context.WithoutCancel(ctx), key); err != nil {
		s.log.Error("agentrunner: releasing claim failed; it expires after the claim TTL", "key", key, "ttl", s.claimTTL, "err", err)
	}
}

func (s *Server) logAck(ctx context.Context, ack *handoffv1.Ack, rpc string) {
	attrs := []any{"rpc", rpc, "job_id", ack.GetJobId(), "stage", ack.GetStage(), "status", ack.GetStatus().String()}
	if len(ack.GetReasons()) > 0 {
		r := ack.GetReasons()[0]
		attrs = append(attrs, "reasons", len(ack.GetReasons()), "field", r.GetField(), "rule", r.GetRule())
	}
	s.log.InfoContext(ctx, "agentrunner: ack", attrs...)
}

func sendAck(stream grpc.ServerStreamingServer[handoffv1.DeliverResponse], ack *handoffv1.Ack) error {
	return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}})
}

// clip makes s valid UTF-8 and shortens it to at most n bytes without splitting a rune.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}
