// Package writeback is the WritebackService: the only writer to external systems. A write is
// refused unless the package carries the judge's PASS, and it is idempotent on
// job_id:stage:artifact_type, so retries, duplicate deliveries and concurrent callers produce
// one external write and all get its receipt.
package writeback

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/store"
)

// Defaults for Options.
const (
	DefaultPendingTTL = 2 * time.Minute
	// RetryDelay is the delay an Aborted answer (write in flight) suggests in its RetryInfo.
	RetryDelay = time.Second
	// storeTimeout bounds one Complete or Release, which run detached from the caller.
	storeTimeout = 10 * time.Second
)

// targetNamePattern is WriteRequest.target's rule; a target whose name breaks it could never
// be addressed.
const targetNamePattern = `^[a-z][a-z0-9_-]*$`

var targetNameRE = regexp.MustCompile(targetNamePattern)

func validTargetName(s string) bool { return len(s) <= 64 && targetNameRE.MatchString(s) }

// Options configures a Server.
type Options struct {
	// Validator checks requests and packages; it must accept handoff.v1. Default:
	// contract.NewValidator(contract.V1).
	Validator *contract.Validator
	// Store holds the idempotency records (claims and receipts). Required.
	Store store.Idempotency
	// Artifacts is where artifact bytes are read from. Required.
	Artifacts artifact.Store
	// Targets are the external systems, addressed by Name (unique). At least one.
	Targets []Target
	// PendingTTL is how long an in-flight claim blocks other callers of the same key (they get
	// Aborted). Default 2m. After it lapses, a claim whose writer died can be taken again, so it
	// must be longer than a write takes: the artifact read and the target call together run
	// under a deadline of PendingTTL/2, so the claim never lapses while its write still runs.
	PendingTTL time.Duration
	// ReceiptTTL is how long a receipt is kept; 0 keeps it forever. A repeat that arrives
	// after the receipt expired is a new write and writes again, so keep it longer than any
	// retry or redelivery horizon of the callers.
	ReceiptTTL time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Now stamps receipts' written_at; default time.Now.
	Now func() time.Time
}

// Server implements handoffv1.WritebackServiceServer.
type Server struct {
	handoffv1.UnimplementedWritebackServiceServer

	v          *contract.Validator
	idem       store.Idempotency
	artifacts  artifact.Store
	targets    map[string]Target
	names      []string // sorted target names, for messages
	pendingTTL time.Duration
	receiptTTL time.Duration
	log        *slog.Logger
	now        func() time.Time
}

// New checks opts and returns the server.
func New(opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("writeback: Options.Store is required")
	}
	if opts.Artifacts == nil {
		return nil, errors.New("writeback: Options.Artifacts is required")
	}
	if len(opts.Targets) == 0 {
		return nil, errors.New("writeback: at least one target is required")
	}
	if opts.PendingTTL < 0 {
		return nil, fmt.Errorf("writeback: PendingTTL %s must not be negative", opts.PendingTTL)
	}
	if opts.ReceiptTTL < 0 {
		return nil, fmt.Errorf("writeback: ReceiptTTL %s must not be negative (0 keeps receipts forever)", opts.ReceiptTTL)
	}
	s := &Server{
		v:          opts.Validator,
		idem:       opts.Store,
		artifacts:  opts.Artifacts,
		targets:    make(map[string]Target, len(opts.Targets)),
		pendingTTL: opts.PendingTTL,
		receiptTTL: opts.ReceiptTTL,
		log:        opts.Logger,
		now:        opts.Now,
	}
	if s.v == nil {
		v, err := contract.NewValidator(contract.V1)
		if err != nil {
			return nil, fmt.Errorf("writeback: %w", err)
		}
		s.v = v
	} else if !s.v.AcceptsVersion(contract.V1) {
		return nil, fmt.Errorf("writeback: the validator must accept %s (it accepts %s)", contract.V1, strings.Join(s.v.Accepts(), ", "))
	}
	for i, t := range opts.Targets {
		if t == nil {
			return nil, fmt.Errorf("writeback: target %d is nil", i)
		}
		name := t.Name()
		if !validTargetName(name) {
			return nil, fmt.Errorf("writeback: target name %q must match %s (max 64 characters)", name, targetNamePattern)
		}
		if _, dup := s.targets[name]; dup {
			return nil, fmt.Errorf("writeback: two targets are named %q", name)
		}
		s.targets[name] = t
		s.names = append(s.names, name)
	}
	slices.Sort(s.names)
	if s.pendingTTL == 0 {
		s.pendingTTL = DefaultPendingTTL
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Register registers srv on s.
func Register(s *grpc.Server, srv *Server) { handoffv1.RegisterWritebackServiceServer(s, srv) }

// Key is the idempotency key of a write: job_id:stage:artifact_type. The attempt (or the judge
// round) is never part of it, so every retry and redelivery of a stage's write hits one slot.
// It is unambiguous even though job ids may contain ':': stage and artifact type cannot.
func Key(jobID, stage, artifactType string) string {
	return jobID + ":" + stage + ":" + artifactType
}

// Write performs one external write, or returns the receipt of the first one with the same key.
//
// Gates, in this order; a request stopped at any of them writes nothing and claims nothing:
//
//  1. Request validation. protovalidate on the WriteRequest (package, artifact and target
//     present and well formed) and contract CheckV1 on the package (version handoff.v1, size
//     cap, every package rule). Failure: InvalidArgument whose message names the fields, with
//     the reasons as google.rpc.BadRequest field violations ("package.job_id", "artifact.uri").
//  2. Writeback gate. package.evaluator.last_verdict must be VERDICT_PASS. Otherwise (FAIL, or
//     no evaluator because no judge ran): FailedPrecondition, "writeback refused: ...".
//  3. Artifact. The request's artifact must be one of package.artifacts (same type and uri;
//     and the same sha256 when both record one). Otherwise: InvalidArgument.
//  4. Target. It must be configured. Otherwise: InvalidArgument naming the known targets.
//  5. Idempotency on Key(job_id, stage, artifact.type), Claim with PendingTTL:
//     - Done: the stored receipt, duplicate=true; no write. (The receipt names the target
//     that was written; a repeat addressed to another target still gets it.)
//     - Pending: another call is writing this key: Aborted with a google.rpc.RetryInfo of
//     RetryDelay; the caller retries and then gets the receipt.
//     - Claimed: read the artifact bytes and check their sha256 (failure: Release, then
//     NotFound when the artifact is missing, else FailedPrecondition); call the target
//     (failure: Release, then Unavailable, so a retry can write); store the Receipt under the
//     key with ReceiptTTL (Complete) and return it, duplicate=false.
//
// Once a call holds the claim it no longer follows the caller's cancellation: the write and
// its receipt are finished (within PendingTTL/2) even if the caller hung up, so its retry finds
// the receipt instead of a half-done write.
func (s *Server) Write(ctx context.Context, req *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	// 1. Request validation.
	if err := s.checkRequest(req); err != nil {
		s.log.InfoContext(ctx, "writeback refused: invalid request",
			"job_id", req.GetPackage().GetJobId(), "target", req.GetTarget(), "error", err)
		return nil, err
	}
	pkg, reqArt := req.GetPackage(), req.GetArtifact()
	jobID, stage := pkg.GetJobId(), pkg.GetStage()
	key := Key(jobID, stage, reqArt.GetType())
	log := s.log.With("job_id", jobID, "key", key, "target", req.GetTarget())

	// 2. Writeback gate: the judge must have passed.
	if v := pkg.GetEvaluator().GetLastVerdict(); v != handoffv1.Verdict_VERDICT_PASS {
		verdict := "absent"
		if pkg.GetEvaluator() != nil {
			verdict = strings.TrimPrefix(v.String(), "VERDICT_")
		}
		log.InfoContext(ctx, "writeback refused: judge has not passed", "verdict", verdict)
		return nil, status.Errorf(codes.FailedPrecondition,
			"writeback refused: last verdict is %s; the judge must pass first", verdict)
	}

	// 3. The artifact must be one the package carries.
	art, err := s.matchArtifact(pkg, reqArt)
	if err != nil {
		log.InfoContext(ctx, "writeback refused: artifact", "error", err)
		return nil, err
	}

	// 4. The target must be configured.
	target, ok := s.targets[req.GetTarget()]
	if !ok {
		msg := fmt.Sprintf("unknown target %q; configured targets: %s", req.GetTarget(), strings.Join(s.names, ", "))
		log.InfoContext(ctx, "writeback refused: unknown target")
		return nil, badRequest(msg, &errdetails.BadRequest_FieldViolation{
			Field: "target", Description: msg, Reason: "TARGET_UNKNOWN",
		})
	}

	// 5. Idempotency.
	state, value, err := s.idem.Claim(ctx, key, s.pendingTTL)
	if err != nil {
		log.ErrorContext(ctx, "writeback: claim failed", "error", err)
		return nil, status.Errorf(codes.Unavailable, "idempotency store: claim %s: %v", key, err)
	}
	switch state {
	case store.Done:
		rc := &handoffv1.Receipt{}
		if err := proto.Unmarshal(value, rc); err != nil {
			log.ErrorContext(ctx, "writeback: stored receipt unreadable", "error", err)
			return nil, status.Errorf(codes.Internal, "stored receipt for key %s is unreadable: %v", key, err)
		}
		if rc.GetTarget() != req.GetTarget() {
			log.WarnContext(ctx, "writeback: key already written to another target", "written_to", rc.GetTarget())
		}
		log.InfoContext(ctx, "writeback duplicate: returning first receipt",
			"duplicate", true, "external_id", rc.GetExternalId())
		return &handoffv1.WriteResponse{Receipt: rc, Duplicate: true}, nil
	case store.Pending:
		log.InfoContext(ctx, "writeback: key in flight", "duplicate", false)
		return nil, inFlight(key)
	case store.Claimed:
	default:
		return nil, status.Errorf(codes.Internal, "idempotency store: claim %s: unexpected state %d", key, state)
	}

	rc, err := s.writeClaimed(ctx, key, pkg, art, target, log)
	if err != nil {
		return nil, err
	}
	log.InfoContext(ctx, "writeback: written", "duplicate", false, "external_id", rc.GetExternalId())
	return &handoffv1.WriteResponse{Receipt: rc, Duplicate: false}, nil
}

// writeClaimed does the work of a claimed key: read, write, store the receipt. Every failure
// before the write succeeded releases the claim.
func (s *Server) writeClaimed(ctx context.Context, key string, pkg *handoffv1.HandoffPackage,
	art *handoffv1.Artifact, target Target, log *slog.Logger) (*handoffv1.Receipt, error) {
	detached := context.WithoutCancel(ctx)
	wctx, cancel := context.WithTimeout(detached, s.pendingTTL/2)
	defer cancel()

	release := func(cause error) {
		rctx, cancel := context.WithTimeout(detached, storeTimeout)
		defer cancel()
		if err := s.idem.Release(rctx, key); err != nil {
			// The claim then blocks the key until PendingTTL; nothing was written.
			log.ErrorContext(ctx, "writeback: release failed", "error", err, "cause", cause)
		}
	}

	payload, err := s.artifacts.Get(wctx, art.GetUri())
	if err != nil {
		release(err)
		log.WarnContext(ctx, "writeback: artifact unreadable", "error", err)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, status.Errorf(codes.NotFound, "artifact %s: not found in the artifact store", art.GetUri())
		}
		return nil, status.Errorf(codes.FailedPrecondition, "artifact %s: %v", art.GetUri(), err)
	}
	if err := artifact.Verify(art, payload); err != nil {
		release(err)
		log.WarnContext(ctx, "writeback: artifact digest mismatch", "error", err)
		return nil, status.Errorf(codes.FailedPrecondition, "%v", err)
	}

	externalID, err := callTarget(wctx, target, WriteInput{
		Key:         key,
		JobID:       pkg.GetJobId(),
		Stage:       pkg.GetStage(),
		Artifact:    art,
		Payload:     payload,
		Traceparent: pkg.GetTrace().GetTraceparent(),
	})
	if err != nil {
		release(err)
		log.WarnContext(ctx, "writeback: target write failed; claim released", "error", err)
		return nil, status.Errorf(codes.Unavailable, "target %s: write for key %s failed, retry: %v", target.Name(), key, err)
	}

	rc := &handoffv1.Receipt{
		IdempotencyKey: key,
		Target:         target.Name(),
		ExternalId:     externalID,
		WrittenAt:      timestamppb.New(s.now()),
		Traceparent:    pkg.GetTrace().GetTraceparent(),
		JobId:          pkg.GetJobId(),
	}
	data, err := proto.Marshal(rc)
	if err == nil {
		err = s.complete(detached, key, data)
	}
	if err != nil {
		// The external write happened. Releasing would invite a second write, so the claim is
		// left to lapse after PendingTTL; a target that enforces the key (the ledger's look-up,
		// the webhook receiver) then returns the same write again.
		log.ErrorContext(ctx, "writeback: written but the receipt could not be stored",
			"external_id", externalID, "error", err)
		return nil, status.Errorf(codes.Internal,
			"write for key %s was done (target %s, external id %s) but its receipt could not be stored: %v",
			key, target.Name(), externalID, err)
	}
	return rc, nil
}

// complete stores the receipt, retrying a few times: after the external write the receipt is
// the one thing that keeps a retry from writing again.
func (s *Server) complete(ctx context.Context, key string, data []byte) error {
	var err error
	for i := range 3 {
		if i > 0 {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(ctx, storeTimeout)
		err = s.idem.Complete(cctx, key, data, s.receiptTTL)
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

// callTarget calls t.Write and turns a panic into an error, so the claim is released.
func callTarget(ctx context.Context, t Target, in WriteInput) (id string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("target panicked: %v", r)
		}
	}()
	return t.Write(ctx, in)
}

// checkRequest is gate 1. The request's own rules come from Validate on the WriteRequest, the
// package's from CheckV1 (which adds the version gate and size cap); Validate's findings
// inside the package are dropped so nothing is reported twice.
func (s *Server) checkRequest(req *handoffv1.WriteRequest) error {
	if req == nil {
		return badRequest("invalid write request: empty request", nil)
	}
	var reasons []*handoffv1.Reason
	for _, r := range contract.Reasons(s.v.Validate(req)) {
		if r.GetRule() == contract.RuleValidateError {
			return status.Errorf(codes.Internal, "request validation could not run: %s", r.GetMessage())
		}
		if strings.HasPrefix(r.GetField(), "package.") {
			continue
		}
		reasons = append(reasons, r)
	}
	if pkg := req.GetPackage(); pkg != nil {
		for _, r := range s.v.CheckV1(pkg) {
			if r.GetRule() == contract.RuleValidateError {
				return status.Errorf(codes.Internal, "package validation could not run: %s", r.GetMessage())
			}
			field := "package"
			if r.GetField() != "" {
				field += "." + r.GetField()
			}
			reasons = append(reasons, &handoffv1.Reason{Field: field, Rule: r.GetRule(), Message: r.GetMessage()})
		}
	}
	if len(reasons) == 0 {
		return nil
	}
	const show = 8
	parts := make([]string, 0, show+1)
	fvs := make([]*errdetails.BadRequest_FieldViolation, 0, len(reasons))
	for i, r := range reasons {
		field := r.GetField()
		if field == "" {
			field = "(request)"
		}
		if i < show {
			parts = append(parts, fmt.Sprintf("%s: %s [%s]", field, r.GetMessage(), r.GetRule()))
		}
		fvs = append(fvs, &errdetails.BadRequest_FieldViolation{
			Field:       r.GetField(),
			Description: fmt.Sprintf("%s [%s]", r.GetMessage(), r.GetRule()),
			Reason:      reasonCode(r.GetRule()),
		})
	}
	if len(reasons) > show {
		parts = append(parts, fmt.Sprintf("and %d more", len(reasons)-show))
	}
	return badRequest("invalid write request: "+strings.Join(parts, "; "), fvs...)
}

// matchArtifact is gate 3: the package's own entry for the request's artifact (same type and
// uri). When the package's entry has no sha256 the request's is used.
func (s *Server) matchArtifact(pkg *handoffv1.HandoffPackage, want *handoffv1.Artifact) (*handoffv1.Artifact, error) {
	for _, a := range pkg.GetArtifacts() {
		if a.GetType() != want.GetType() || a.GetUri() != want.GetUri() {
			continue
		}
		if a.GetSha256() != "" && want.GetSha256() != "" && a.GetSha256() != want.GetSha256() {
			msg := fmt.Sprintf("artifact %s (%s): sha256 %s differs from the package's %s",
				want.GetType(), want.GetUri(), want.GetSha256(), a.GetSha256())
			return nil, badRequest(msg, &errdetails.BadRequest_FieldViolation{
				Field: "artifact.sha256", Description: msg, Reason: "ARTIFACT_SHA256_MISMATCH",
			})
		}
		if a.GetSha256() == "" && want.GetSha256() != "" {
			a = proto.Clone(a).(*handoffv1.Artifact)
			a.Sha256 = want.GetSha256()
		}
		return a, nil
	}
	msg := fmt.Sprintf("artifact %s (%s) is not one of the package's artifacts", want.GetType(), want.GetUri())
	return nil, badRequest(msg, &errdetails.BadRequest_FieldViolation{
		Field: "artifact", Description: msg, Reason: "ARTIFACT_NOT_IN_PACKAGE",
	})
}

// badRequest is InvalidArgument with a google.rpc.BadRequest detail.
func badRequest(msg string, fvs ...*errdetails.BadRequest_FieldViolation) error {
	st := status.New(codes.InvalidArgument, msg)
	if len(fvs) == 0 {
		return st.Err()
	}
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: fvs}); err == nil {
		st = d
	}
	return st.Err()
}

// inFlight is Aborted with a google.rpc.RetryInfo detail.
func inFlight(key string) error {
	st := status.New(codes.Aborted, fmt.Sprintf("write for key %s is in flight; retry", key))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(RetryDelay)}); err == nil {
		st = d
	}
	return st.Err()
}

// reasonCode turns a rule id ("string.pattern") into google.rpc's UPPER_SNAKE_CASE reason.
func reasonCode(rule string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(rule) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := strings.Trim(b.String(), "_")
	if len(out) > 63 {
		out = out[:63]
	}
	return out
}
