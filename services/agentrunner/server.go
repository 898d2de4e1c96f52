// Package agentrunner hosts stage agents behind handoff.v1.AgentRunnerService.
//
// Every package is answered with an Ack before any agent work: a package that is malformed,
// misrouted, already done or over budget costs no agent call. Those decisions are made by
// the server's interceptor chain (Server.Interceptors, installed by Server.Service and internal/server), not by
// the handlers: schema, role, stage de-duplication and the job's wallet, in that order. The
// Deliver handler only runs the agent of an accepted package; the idempotency interceptor
// records its result under the completion key, so a re-delivered package gets the first
// result back (DUPLICATE) instead of a second run.
package agentrunner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/budget"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/telemetry"
)

// DefaultStageTimeout bounds one agent run when Options.StageTimeout is zero.
const DefaultStageTimeout = 60 * time.Second

// Rule ids of the reasons this runner emits itself (schema reasons come from contract, budget
// reasons from the budget interceptor, whose rule is the same "budget.empty").
const (
	RuleRoleAgent   = "role.agent"     // no agent is registered under the requested name
	RuleRoleTools   = "role.tools"     // the agent's role card lacks a required tool
	RuleBudgetEmpty = budget.RuleEmpty // money or hops left is zero (the budget interceptor's rule)
)

// Store is what the runner keeps in the shared store: stage-completion records (the
// idempotency interceptor) and the jobs' wallets (the budget interceptor); a delivery's
// claim and hop debit are one Admit, a single round trip. store.Store (bbolt
// or Redis) satisfies it.
type Store interface {
	store.Idempotency
	store.Wallets
	store.Admitter
}

// Options configure a Server.
type Options struct {
	// Validator's accepted versions are what the runner's agents declare unless their
	// RoleCard says otherwise (Describe, and the version gate). nil builds the default
	// (accepting handoff.v1 and handoff.v2).
	Validator *contract.Validator
	// Now is the clock budget.deadline is checked against (default time.Now).
	Now func() time.Time
	// Store records stage completions and holds the wallets hops are debited from (required).
	Store Store
	// Artifacts is handed to agents to read and write artifacts (required).
	Artifacts artifact.Store
	// Agents served by this runner, addressed by their card names (unique).
	Agents []Agent
	// StageTimeout bounds one agent run (default 60s).
	StageTimeout time.Duration
	// ClaimTTL is how long a pending claim blocks other deliveries of the same stage after
	// its runner stopped renewing it: the claim is renewed every ClaimTTL/3 while the agent
	// works, so a runner that died mid-stage frees the stage within ClaimTTL and the
	// coordinator's retry runs it on another runner. Default DefaultClaimTTL; at least
	// MinClaimTTL (a smaller value is raised, with a warning).
	ClaimTTL time.Duration
	// ResultTTL is how long stage-completion records are kept (0 = forever).
	ResultTTL time.Duration
	// Logger receives one line per package (default slog.Default()).
	Logger *slog.Logger
	// GenAISpans adds the OpenTelemetry GenAI spans (invoke_agent per agent run, and the
	// execute_tool spans LLM agents start) under the handoff.ack span; off by default, the
	// conventions being of Development stability (telemetry.StartAgent).
	GenAISpans bool
}

// Server implements handoffv1.AgentRunnerServiceServer. Its handlers rely on the interceptors
// of Server.Interceptors; serve it with server.New(srv.Service(), ...).
type Server struct {
	handoffv1.UnimplementedAgentRunnerServiceServer

	v         *contract.Validator // the declared versions
	all       *contract.Validator // every version: the rules of a package the gate let in
	now       func() time.Time
	st        Store
	artifacts artifact.Store
	agents    map[string]Agent
	timeout   time.Duration
	claimTTL  time.Duration
	resultTTL time.Duration
	genai     bool
	log       *slog.Logger

	unary  []grpc.UnaryServerInterceptor
	stream []grpc.StreamServerInterceptor
}

var roleName = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// DefaultClaimTTL is Options.ClaimTTL's default: a killed runner's stage is free again
// within 3s, for one renewal a second (one store command) per stage in flight.
const DefaultClaimTTL = 3 * time.Second

// MinClaimTTL is the smallest ClaimTTL: a renewal every third of it must fit a store round
// trip with room to spare.
const MinClaimTTL = 300 * time.Millisecond

// workSlack is what a stage's work may take beyond the agent's StageTimeout: sending the
// ack and the result, and storing the completion.
const workSlack = 15 * time.Second

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
	all, err := contract.NewValidator()
	if err != nil {
		return nil, fmt.Errorf("agentrunner: %w", err)
	}
	s := &Server{
		v:         v,
		all:       all,
		now:       opts.Now,
		st:        opts.Store,
		artifacts: opts.Artifacts,
		agents:    make(map[string]Agent, len(opts.Agents)),
		timeout:   opts.StageTimeout,
		claimTTL:  opts.ClaimTTL,
		resultTTL: opts.ResultTTL,
		genai:     opts.GenAISpans,
		log:       opts.Logger,
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.timeout <= 0 {
		s.timeout = DefaultStageTimeout
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.claimTTL <= 0 {
		s.claimTTL = DefaultClaimTTL
	} else if s.claimTTL < MinClaimTTL {
		s.log.Warn("agentrunner: ClaimTTL is below the minimum; raised, so its renewals fit store round trips",
			"claim_ttl", s.claimTTL, "raised_to", MinClaimTTL)
		s.claimTTL = MinClaimTTL
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
		for _, a := range a.Card().Accepts {
			if !contract.Known(a) {
				return nil, fmt.Errorf("agentrunner: Agents[%d]: card accepts unknown version %q", i, a)
			}
		}
		if _, dup := s.agents[name]; dup {
			return nil, fmt.Errorf("agentrunner: two agents named %q", name)
		}
		s.agents[name] = a
	}
	s.unary, s.stream = s.buildInterceptors()
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

// Register registers srv's AgentRunnerService on s. The server must run srv.Interceptors()
// (server.New(srv.Service(), ...) does): without them Deliver and Check fail with codes.Internal rather than
// answer a package nobody checked.
func Register(s grpc.ServiceRegistrar, srv *Server) {
	s.RegisterService(&serviceDesc, srv)
}

// serviceDesc is the generated AgentRunnerService_ServiceDesc with one handler of its own:
// Deliver's, which takes the request by reference from the interceptor that holds it
// (hop.Receive) instead of the generated handler's RecvMsg, whose proto.Merge copies the
// whole package once more on every hop. Agents must not modify Input.Package, so the
// interceptors and the agent can share one message. Every other method (and any added to
// the proto) keeps its generated handler.
var serviceDesc = func() grpc.ServiceDesc {
	d := handoffv1.AgentRunnerService_ServiceDesc
	d.Streams = slices.Clone(d.Streams)
	for i := range d.Streams {
		if d.Streams[i].StreamName == "Deliver" {
			d.Streams[i].Handler = deliverHandler
			return d
		}
	}
	panic("agentrunner: AgentRunnerService has no Deliver stream")
}()

// deliverHandler is the generated _AgentRunnerService_Deliver_Handler receiving through
// hop.Receive: the held request itself when an interceptor holds it, else a RecvMsg of its
// own (a server without the runner's chain).
func deliverHandler(srv any, stream grpc.ServerStream) error {
	m, err := hop.Receive(stream, new(handoffv1.DeliverRequest))
	if err != nil {
		return err
	}
	return srv.(handoffv1.AgentRunnerServiceServer).Deliver(m.(*handoffv1.DeliverRequest),
		&grpc.GenericServerStream[handoffv1.DeliverRequest, handoffv1.DeliverResponse]{ServerStream: stream})
}

// Service is the runner as internal/server assembles it: the AgentRunnerService and its
// enforcement (Interceptors) as step 6 of the chain.
func (s *Server) Service() server.Service {
	unary, stream := s.Interceptors()
	return server.Service{Name: "agentrunner", Register: func(g *grpc.Server) { Register(g, s) }, Unary: unary, Stream: stream}
}

// CompletionKey is the idempotency key of one stage completion:
// "stage:<job_id>:<stage>:<round>", round being the number of judge verdicts so far, with
// ":o<returns>" appended once a person has sent the job back to a stage (returns =
// package.operator_returns). The retry attempt is never part of it: a re-delivery hits the
// same key, while a revision after a judge FAIL (one more verdict) or a stage a person
// sends the job back to is a new key.
func CompletionKey(jobID, stage string, round, returns uint32) string {
	return VisitKey(jobID, stage, round, returns, 0)
}

// VisitKey is CompletionKey for a stage's visit (package.visit): ":v<visit>" is appended
// when a route sent the job back to a stage it was at in this round, so that arrival runs the
// stage again instead of answering DUPLICATE. First visits keep CompletionKey's key.
func VisitKey(jobID, stage string, round, returns, visit uint32) string {
	key := fmt.Sprintf("stage:%s:%s:%d", jobID, stage, round)
	if returns > 0 {
		key += fmt.Sprintf(":o%d", returns)
	}
	if visit > 0 {
		key += fmt.Sprintf(":v%d", visit)
	}
	return key
}

// packageKey is the completion key of the stage run package p asks for. A merge's key also
// names the branch results it merges (MergeKey), so one set of them merges once.
func packageKey(p *handoffv1.HandoffPackage) string {
	key := VisitKey(p.GetJobId(), p.GetStage(), p.GetEvaluator().GetRounds(), p.GetOperatorReturns(), p.GetVisit())
	if len(p.GetBranchResults()) > 0 {
		key += ":m" + MergeKey(p.GetBranchResults())
	}
	return key
}

// MergeKey names a set of branch results: a digest of each branch with the artifacts it
// produced (type, version, uri, sha256), in branch order. The same results re-delivered give
// the same key; another set (a branch left out, a branch's new result) another.
func MergeKey(results []*handoffv1.BranchResult) string {
	rs := slices.Clone(results)
	slices.SortFunc(rs, func(a, b *handoffv1.BranchResult) int { return strings.Compare(a.GetBranch(), b.GetBranch()) })
	h := sha256.New()
	for _, r := range rs {
		fmt.Fprintf(h, "b\x00%s\x00", r.GetBranch())
		for _, a := range r.GetArtifacts() {
			fmt.Fprintf(h, "a\x00%s\x00%s\x00%s\x00%s\x00", a.GetType(), a.GetSchemaVersion(), a.GetUri(), a.GetSha256())
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
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

// noChain is the answer of a handler reached without the runner's interceptors: it would
// otherwise run a package that nobody checked.
func noChain(method string) error {
	return status.Errorf(codes.Internal,
		"agentrunner: %s reached its handler without the runner's interceptors; serve the runner with server.New(runner.Service(), ...)", method)
}

// Deliver runs the agent of an accepted package. Everything that can refuse the package has
// already happened in the interceptor chain (see Interceptors): schema (REJECTED_SCHEMA),
// role (REJECTED_ROLE), the completion key (DUPLICATE with the prior result, or gRPC Aborted
// while the stage is in flight), the wallet (REJECTED_BUDGET; a hop is debited). So the
// handler sends the ACCEPTED Ack (the budget interceptor stamps ack.wallet when it debited
// a stored wallet), runs the agent bounded by the stage timeout, and sends one StageResult.
// A failed run (error, timeout, panic, invalid result) sends a STAGE_STATUS_FAILED result,
// which releases the claim so a retry runs the stage again; a COMPLETED result is recorded
// under the completion key before it is sent.
//
// The run is detached from the caller's cancellation by the idempotency interceptor (the
// context keeps its values): a caller that hangs up does not waste the work, which is
// recorded and returned as DUPLICATE to the retry.
func (s *Server) Deliver(req *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	ctx := stream.Context()
	ag, ok := agentFrom(ctx)
	if !ok {
		return noChain("Deliver")
	}
	p := req.GetPackage()
	round := p.GetEvaluator().GetRounds()
	ack := contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	s.logAck(ctx, ack, "deliver")
	if err := sendAck(stream, ack); err != nil {
		return err
	}

	runCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := time.Now()
	reads := artifact.Recording(artifact.WithCompletion(s.artifacts, p.GetOperatorReturns(), p.GetVisit()))
	var agentSpan *telemetry.AgentSpan
	if s.genai {
		runCtx, agentSpan = telemetry.StartAgent(runCtx, ag.Card().Name, AgentID(ag.Card().Name))
	}
	res, runErr := s.run(runCtx, ag, Input{Package: p, V2: v2From(ctx), Round: round, Routes: req.GetRoutes(), Artifacts: reads})
	if runErr == nil {
		// What the stage read is the runtime's record, never the agent's word.
		res.ArtifactsRead = reads.Reads()
		runErr = s.finish(p, res)
	}
	// An agent's error may quote what it read (a model's refusal): it is recorded, sent,
	// logged and put on the span with personal data masked.
	var masked error
	if runErr != nil {
		masked = errors.New(resultPII.Mask(runErr.Error()))
	}
	agentSpan.End(masked)
	if runErr != nil {
		failed := &handoffv1.StageResult{
			JobId: p.GetJobId(), Stage: p.GetStage(),
			Status:      handoffv1.StageStatus_STAGE_STATUS_FAILED,
			Error:       clip(masked.Error(), 2000),
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
			"agent", ag.Card().Name, "status", failed.Status.String(), "duration", time.Since(start), "err", masked)
		return stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: failed}})
	}
	if err := stream.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: res}}); err != nil {
		// The result goes out before its completion is stored (the idempotency interceptor
		// logs which of the two failed): it may have reached the caller all the same.
		s.log.ErrorContext(ctx, "agentrunner: stage completed but sending or storing its result failed", "job_id", p.GetJobId(), "stage", p.GetStage(),
			"round", round, "agent", ag.Card().Name, "err", err)
		return err
	}
	if s.log.Enabled(ctx, slog.LevelInfo) { // at the services' warn level the line's ten attributes are not built
		s.log.InfoContext(ctx, "agentrunner: stage completed", "job_id", p.GetJobId(), "stage", p.GetStage(), "round", round,
			"agent", ag.Card().Name, "status", res.GetStatus().String(), "artifacts", len(res.GetArtifacts()),
			"spent_usd_micros", res.GetSpentUsdMicros(), "duration", time.Since(start))
	}
	return nil
}

// Check answers with the Ack Deliver would send first and does no work. Schema, role and
// budget (read, never debited) are decided by the interceptor chain; the handler looks the
// completion key up (it never claims it): Done -> DUPLICATE with the prior result, Pending
// -> gRPC Aborted (as Deliver), no record -> ACCEPTED.
func (s *Server) Check(ctx context.Context, req *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	if _, ok := agentFrom(ctx); !ok {
		return nil, noChain("Check")
	}
	p := req.GetPackage()
	key := packageKey(p)
	state, value, err := s.st.Lookup(ctx, key)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "idempotency store: %v", err)
	}
	var ack *handoffv1.Ack
	switch state {
	case store.Done:
		if ack, err = duplicateAck(p, value); err != nil {
			return nil, err
		}
	case store.Pending:
		return nil, status.Errorf(codes.Aborted, "stage %s is in flight on another delivery; retry later", key)
	default:
		ack = contract.AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
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
	// The result is recorded under the completion key in the shared store and goes into the
	// next packages: personal data in its free text fails the stage here, before either.
	if fs := resultPII.Scan(res); len(fs) > 0 {
		var where []string
		for _, f := range fs {
			where = append(where, f.Field+" ("+pii.Describe(f.Kind)+")")
		}
		return fmt.Errorf("agent result holds personal data in %s: agents pass memory refs, never the data", strings.Join(where, ", "))
	}
	return nil
}

// AgentID is an agent's gen_ai.agent.id: "agentrunner/<card name>", the name the rail
// addresses it by on its runner (DeliverRequest.agent).
func AgentID(name string) string { return "agentrunner/" + name }

// resultPII is the check on every agent result (the built-in detectors).
var resultPII = pii.Builtin()

// clip makes s valid UTF-8 and shortens it to at most n bytes without splitting a rune.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}
