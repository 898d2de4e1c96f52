package writeback

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/idempotency"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/server"
)

// Interceptors returns the writeback's enforcement (step 6 of the rpc chain, after identity
// and trace, before recovery), outermost first. Each sits where it does for a reason:
//
//  1. validate: protovalidate on the WriteRequest and contract CheckV1 on its package;
//     InvalidArgument whose message and google.rpc.BadRequest name the fields
//     ("package.job_id", "artifact.uri", "target"). First, because everything after it reads
//     the package and the artifact and must only ever see schema-valid ones; a malformed
//     request costs nothing further.
//  2. gate: the judge passed (else FailedPrecondition), the artifact is one of the package's
//     (type+uri, consistent sha256; else InvalidArgument), the target is configured (else
//     InvalidArgument naming the known targets). Before idempotency, so a refused write
//     claims nothing and writes nothing, and a repeat of a completed key whose package now
//     carries a FAIL verdict (or names a foreign artifact or unknown target) is refused
//     rather than answered with the stored receipt: the gate holds on every call.
//  3. idempotency on Key(job_id, stage, artifact.type): claim with PendingTTL; a completed
//     key is answered with its stored response marked duplicate=true and the handler does not
//     run; a key in flight is Aborted with a RetryInfo of RetryDelay; a claimed one runs the
//     handler detached from the caller's cancellation (under PendingTTL/2), stores its
//     response for ReceiptTTL before it is sent, or releases the key when the handler fails.
//     Last, right around the handler, so only a write that is allowed is claimed, and
//     recovery (inside it) turns a handler panic into an error that releases the key.
//
// The handler (Write) then only reads the artifact and calls the target. Each call returns
// new interceptors over the Server's store and options.
func (s *Server) Interceptors() []grpc.UnaryServerInterceptor {
	const write = handoffv1.WritebackService_Write_FullMethodName
	return []grpc.UnaryServerInterceptor{
		validate.UnaryServerInterceptor(s.v),
		s.gate(),
		idempotency.UnaryServerInterceptor(s.idem,
			idempotency.WithKey(write, func() proto.Message { return &handoffv1.WriteResponse{} }, writeKey),
			idempotency.WithReplay(write, func(stored proto.Message) {
				stored.(*handoffv1.WriteResponse).Duplicate = true
			}),
			idempotency.WithPendingTTL(s.pendingTTL),
			idempotency.WithResultTTL(s.receiptTTL),
			idempotency.WithRetryDelay(RetryDelay),
			idempotency.WithLogger(s.log),
		),
	}
}

// writeKey is the idempotency key of a WriteRequest.
func writeKey(m proto.Message) (string, error) {
	r, ok := m.(*handoffv1.WriteRequest)
	if !ok {
		return "", fmt.Errorf("request %T is not a WriteRequest", m)
	}
	return Key(r.GetPackage().GetJobId(), r.GetPackage().GetStage(), r.GetArtifact().GetType()), nil
}

// Service is the writeback as internal/server assembles it: the WritebackService and its
// enforcement (Interceptors) as step 6 of the chain.
func (s *Server) Service() server.Service {
	return server.Service{Name: "writeback", Register: func(g *grpc.Server) { Register(g, s) }, Unary: s.Interceptors()}
}
