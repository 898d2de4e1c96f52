// Package writeback is the WritebackService: the only writer to external systems. A write is
// refused unless the package carries the judge's PASS, and it is idempotent on
// job_id:stage:artifact_type, so retries, duplicate deliveries and concurrent callers produce
// one external write and all get its receipt.
//
// The refusals and the idempotency are the interceptor chain's, not the handler's: serve the
// service with server.New(srv.Service(), ...) (internal/server), which puts Server.Interceptors
// in the chain. The Write handler itself only reads the artifact and calls the target.
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/crashpoint"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/store"
)

// Defaults for Options.
const (
	DefaultPendingTTL = idempotency.DefaultPendingTTL
	// RetryDelay is the delay an Aborted answer (write in flight) suggests in its RetryInfo.
	RetryDelay = idempotency.DefaultRetryDelay
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
	// Store holds the idempotency records (claims and receipts; a receipt is stored as the
	// marshalled WriteResponse). Required. A ReceiptTarget on this same store (NewLedger
	// over it) writes each entry and its receipt in one transaction.
	Store store.Idempotency
	// Artifacts is where artifact bytes are read from. Required.
	Artifacts artifact.Store
	// Targets are the external systems, addressed by Name (unique). At least one.
	Targets []Target
	// PendingTTL is how long an in-flight claim blocks other callers of the same key (they get
	// Aborted with a RetryInfo of RetryDelay). Default 2m. After it lapses, a claim whose
	// writer died can be taken again, so it must be longer than a write takes: the idempotency
	// interceptor runs the handler (artifact read and target call) under a deadline of
	// PendingTTL/2, so the claim never lapses while its write still runs.
	PendingTTL time.Duration
	// ReceiptTTL is how long a receipt is kept; 0 keeps it forever. A repeat that arrives
	// after the receipt expired is a new write and calls the target again (the ledger
	// answers it with the key's first entry; a webhook gets the key again), so keep it
	// longer than any retry or redelivery horizon of the callers.
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

// Register registers srv on s. s must run srv.Interceptors() (Service does both);
// without them Write refuses every call (Internal) rather than write ungated.
func Register(s *grpc.Server, srv *Server) { handoffv1.RegisterWritebackServiceServer(s, srv) }

// Key is the idempotency key of a write: job_id:stage:artifact_type. The attempt (or the judge
// round) is never part of it, so every retry and redelivery of a stage's write hits one slot.
// It is unambiguous even though job ids may contain ':': stage and artifact type cannot.
func Key(jobID, stage, artifactType string) string {
	return jobID + ":" + stage + ":" + artifactType
}

// Write performs one external write. It is only the write: everything that decides whether
// and how often it runs is the interceptor chain's (see Interceptors), which by the time
// Write is called has validated the request, passed the gate (PASS verdict, artifact,
// target) and claimed the idempotency key. Write then
//
//   - reads the artifact bytes and checks their sha256: NotFound when the artifact is
//     missing from the artifact store, FailedPrecondition when it is unreadable or its
//     bytes do not match;
//   - calls the target (a panicking target counts as a failed one): Unavailable on
//     failure, so a retry can write. A ReceiptTarget on the service's own store (the
//     ledger) stores the receipt in the same transaction as its write;
//   - returns the receipt, duplicate=false.
//
// Every error comes before the external write succeeded, so the idempotency interceptor
// releases the key and a retry writes; on success it stores the response under the key
// before it is sent, and repeats get it back with duplicate=true. The context is the
// interceptor's: detached from the caller's cancellation and bounded by PendingTTL/2, so a
// caller that hangs up does not abandon a claimed write.
//
// Write refuses (Internal, nothing written) when the gate did not run: a server that
// registered the service without Interceptors would otherwise write without the PASS gate
// and without idempotency.
func (s *Server) Write(ctx context.Context, req *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	w, ok := gatedFrom(ctx)
	if !ok || w.req != req {
		s.log.ErrorContext(ctx, "writeback: Write called without its interceptor chain; refused")
		return nil, status.Error(codes.Internal,
			"writeback: the Write handler ran without its interceptor chain (validate, gate, idempotency); nothing was written")
	}
	log := s.log.With("job_id", w.pkg.GetJobId(), "key", w.key, "target", w.target.Name())

	payload, err := s.artifacts.Get(ctx, w.art.GetUri())
	if err != nil {
		log.WarnContext(ctx, "writeback: artifact unreadable", "error", err)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, status.Errorf(codes.NotFound, "artifact %s: not found in the artifact store", w.art.GetUri())
		}
		// The store's error names the URI and the refused name below the root, not the root.
		return nil, status.Errorf(codes.FailedPrecondition, "%v", err)
	}
	if err := artifact.Verify(w.art, payload); err != nil {
		log.WarnContext(ctx, "writeback: artifact digest mismatch", "error", err)
		return nil, status.Errorf(codes.FailedPrecondition, "%v", err)
	}

	now := s.now()
	answer := func(externalID string) *handoffv1.WriteResponse {
		return &handoffv1.WriteResponse{Receipt: &handoffv1.Receipt{
			IdempotencyKey: w.key,
			Target:         w.target.Name(),
			ExternalId:     externalID,
			WrittenAt:      timestamppb.New(now),
			Traceparent:    w.pkg.GetTrace().GetTraceparent(),
			Tracestate:     w.pkg.GetTrace().GetTracestate(),
			JobId:          w.pkg.GetJobId(),
		}}
	}
	externalID, withReceipt, err := s.callTarget(ctx, w.target, WriteInput{
		Key:         w.key,
		JobID:       w.pkg.GetJobId(),
		Stage:       w.pkg.GetStage(),
		Artifact:    w.art,
		Payload:     payload,
		Traceparent: w.pkg.GetTrace().GetTraceparent(),
	}, answer)
	if errors.Is(err, store.ErrNotOwner) {
		// This write's claim lapsed and another write of the key holds it: its receipt,
		// not this one's, is the key's, and nothing of this one was stored over it.
		log.ErrorContext(ctx, "writeback: the key's claim lapsed and another write holds it; this write's receipt is refused", "error", err)
		return nil, status.Errorf(codes.Aborted, "target %s: the claim of key %s lapsed and another write holds it; retry to get its receipt: %v", w.target.Name(), w.key, err)
	}
	if err != nil {
		log.WarnContext(ctx, "writeback: target write failed; the key is released", "error", err)
		return nil, status.Errorf(codes.Unavailable, "target %s: write for key %s failed, retry: %v", w.target.Name(), w.key, err)
	}
	crashpoint.Hit(crashpoint.AfterWrite, w.key)
	log.InfoContext(ctx, "writeback: written", "duplicate", false, "external_id", externalID, "receipt_with_write", withReceipt)
	return answer(externalID), nil
}

// callTarget makes the write and turns a target's panic into an error, so the claim is
// released. A ReceiptTarget on the service's own store writes the receipt in the same
// transaction (withReceipt true: the idempotency interceptor is told it is stored, see
// idempotency.Claim); any other target only writes, and the interceptor stores the receipt
// after it. answer builds the response, whose marshalled form is the receipt.
func (s *Server) callTarget(ctx context.Context, t Target, in WriteInput, answer func(externalID string) *handoffv1.WriteResponse) (id string, withReceipt bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			id, withReceipt, err = "", false, fmt.Errorf("target panicked: %v", r)
		}
	}()
	rt, ok := t.(ReceiptTarget)
	claim, held := idempotency.ClaimFrom(ctx)
	if !ok || !held || !rt.KeepsReceiptsIn(s.idem) {
		id, err = t.Write(ctx, in)
		return id, false, err
	}
	id, err = rt.WriteReceipt(ctx, in, claim.Key, claim.Owner, claim.ResultTTL, func(id string) ([]byte, error) {
		crashpoint.Hit(crashpoint.InWrite, claim.Key)
		return proto.Marshal(answer(id))
	})
	if err != nil {
		return "", false, err
	}
	claim.Stored()
	return id, true, nil
}
