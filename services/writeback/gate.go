package writeback

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// gated is what the gate resolved for one Write; the handler reads it from the context.
type gated struct {
	req    *handoffv1.WriteRequest // the request it was resolved from
	pkg    *handoffv1.HandoffPackage
	art    *handoffv1.Artifact // the package's entry for the request's artifact
	target Target
	key    string
}

type gatedKey struct{}

func gatedFrom(ctx context.Context) (*gated, bool) {
	w, ok := ctx.Value(gatedKey{}).(*gated)
	return w, ok && w != nil
}

// gate is the writeback's own refusals, checked on a schema-valid WriteRequest (validate runs
// before it) and before the idempotency key is claimed, in this order:
//
//  1. The judge passed: package.evaluator.last_verdict is VERDICT_PASS. Otherwise (FAIL, or
//     no evaluator because no judge ran): FailedPrecondition, "writeback refused: last
//     verdict is FAIL; the judge must pass first".
//  2. The artifact is one of package.artifacts (same type and uri; the same sha256 when both
//     record one). Otherwise: InvalidArgument with a BadRequest violation on "artifact" or
//     "artifact.sha256".
//  3. The target is configured. Otherwise: InvalidArgument naming the configured targets,
//     with a BadRequest violation on "target".
//
// A refused write claims nothing and writes nothing. A passed one goes on with what the gate
// resolved (the package's artifact entry, the Target, the key) in the context for Write.
//
// The gate also logs repeats answered from a stored receipt, which the handler never sees
// (with a warning when the repeat addressed another target than the one written).
// Methods other than Write pass through.
func (s *Server) gate() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != handoffv1.WritebackService_Write_FullMethodName {
			return handler(ctx, req)
		}
		r, ok := req.(*handoffv1.WriteRequest)
		if !ok {
			return nil, status.Errorf(codes.Internal, "writeback gate: request %T is not a WriteRequest", req)
		}
		w, err := s.check(ctx, r)
		if err != nil {
			return nil, err
		}
		resp, err := handler(context.WithValue(ctx, gatedKey{}, w), req)
		if wr, ok := resp.(*handoffv1.WriteResponse); ok && err == nil && wr.GetDuplicate() {
			log := s.log.With("job_id", w.pkg.GetJobId(), "key", w.key, "target", r.GetTarget())
			if written := wr.GetReceipt().GetTarget(); written != r.GetTarget() {
				log.WarnContext(ctx, "writeback: key already written to another target", "written_to", written)
			}
			log.InfoContext(ctx, "writeback duplicate: returning first receipt",
				"duplicate", true, "external_id", wr.GetReceipt().GetExternalId())
		}
		return resp, err
	}
}

// check runs the gate's three checks on r.
func (s *Server) check(ctx context.Context, r *handoffv1.WriteRequest) (*gated, error) {
	pkg := r.GetPackage()
	key := Key(pkg.GetJobId(), pkg.GetStage(), r.GetArtifact().GetType())
	log := s.log.With("job_id", pkg.GetJobId(), "key", key, "target", r.GetTarget())

	if v := pkg.GetEvaluator().GetLastVerdict(); v != handoffv1.Verdict_VERDICT_PASS {
		verdict := "absent"
		if pkg.GetEvaluator() != nil {
			verdict = strings.TrimPrefix(v.String(), "VERDICT_")
		}
		log.InfoContext(ctx, "writeback refused: judge has not passed", "verdict", verdict)
		return nil, status.Errorf(codes.FailedPrecondition,
			"writeback refused: last verdict is %s; the judge must pass first", verdict)
	}

	art, err := matchArtifact(pkg, r.GetArtifact())
	if err != nil {
		log.InfoContext(ctx, "writeback refused: artifact", "error", err)
		return nil, err
	}

	target, ok := s.targets[r.GetTarget()]
	if !ok {
		msg := fmt.Sprintf("unknown target %q; configured targets: %s", r.GetTarget(), strings.Join(s.names, ", "))
		log.InfoContext(ctx, "writeback refused: unknown target")
		return nil, badRequest(msg, &errdetails.BadRequest_FieldViolation{
			Field: "target", Description: msg, Reason: "TARGET_UNKNOWN",
		})
	}
	return &gated{req: r, pkg: pkg, art: art, target: target, key: key}, nil
}

// matchArtifact returns the package's own entry for the request's artifact (same type and
// uri). When the package's entry has no sha256 the request's is used.
func matchArtifact(pkg *handoffv1.HandoffPackage, want *handoffv1.Artifact) (*handoffv1.Artifact, error) {
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
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: fvs}); err == nil {
		st = d
	}
	return st.Err()
}
