package rpc

import (
	"context"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Deliver is the client side of AgentRunnerService/Deliver: it sends one package and reads
// the Ack and, after ACCEPTED, the StageResult. Any other first message, or a stream that
// ends after ACCEPTED without a result, is an error: the runner broke the ack-first
// protocol.
//
// It returns as soon as the last message is in; the stream's end is read in the background
// (see finish). The runner stores a completion while its result travels, so a status after
// the result (the store write failed) changes nothing for a caller that keeps the result
// itself, as the coordinator does. ctx bounds the call until then: its cancellation or
// deadline ends the stream while a message is still awaited, and no longer once the last
// one is in (callers cancel their context as soon as Deliver returns).
func Deliver(ctx context.Context, runner handoffv1.AgentRunnerServiceClient, req *handoffv1.DeliverRequest) (*handoffv1.Ack, *handoffv1.StageResult, error) {
	// The stream's own context keeps ctx's values and deadline but not its cancellation,
	// which is linked by hand (stop unlinks it once the last message is in).
	base := context.WithoutCancel(ctx)
	var sctx context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		sctx, cancel = context.WithDeadline(base, dl)
	} else {
		sctx, cancel = context.WithCancel(base)
	}
	stop := context.AfterFunc(ctx, cancel)
	fail := func(err error) (*handoffv1.Ack, *handoffv1.StageResult, error) {
		stop()
		cancel()
		if ctxErr := ctx.Err(); ctxErr != nil {
			// The stream ended because ctx did (cancelled, or its deadline passed): say so
			// as ctx does, whichever of the two links noticed first.
			if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
				return nil, nil, status.FromContextError(ctxErr).Err()
			}
		}
		return nil, nil, err
	}
	stream, err := runner.Deliver(sctx, req)
	if err != nil {
		return fail(err)
	}
	done := func(ack *handoffv1.Ack, res *handoffv1.StageResult) (*handoffv1.Ack, *handoffv1.StageResult, error) {
		stop()
		go finish(stream.Recv, cancel, drainTimeout)
		return ack, res, nil
	}
	first, err := stream.Recv()
	if err != nil {
		return fail(err)
	}
	ack := first.GetAck()
	if ack == nil {
		return fail(status.Error(codes.Internal, "agent runner broke the protocol: first message is not an ack"))
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		return done(ack, nil) // a refusal is the stream's one message
	}
	msg, err := stream.Recv()
	if err == io.EOF {
		return fail(status.Error(codes.Unavailable, "agent runner closed the stream after ACCEPTED without a result"))
	}
	if err != nil {
		return fail(err)
	}
	if msg.GetResult() == nil {
		return fail(status.Error(codes.Internal, "agent runner broke the protocol: second message is not a stage result"))
	}
	return done(ack, msg.GetResult())
}

// drainTimeout bounds the wait for the end of a Deliver stream after its last message.
var drainTimeout = 2 * time.Second

// finish reads the stream's end after its last message rather than cancel the stream: the
// call then ends OK on both sides, in the client's span and metrics too, instead of
// Canceled, and the connection carries no RST_STREAM. A runner that keeps the stream open
// is not waited for longer than drainTimeout; cancel ends the stream either way.
func finish[T any](recv func() (T, error), cancel context.CancelFunc, timeout time.Duration) {
	t := time.AfterFunc(timeout, cancel)
	recv()
	t.Stop()
	cancel()
}
