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
// the Ack and, after ACCEPTED, the StageResult, then the stream's end. Any
// other first message, or a stream that ends after ACCEPTED without a result, is an error:
// the runner broke the ack-first protocol.
func Deliver(ctx context.Context, runner handoffv1.AgentRunnerServiceClient, req *handoffv1.DeliverRequest) (*handoffv1.Ack, *handoffv1.StageResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := runner.Deliver(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	ack := first.GetAck()
	if ack == nil {
		return nil, nil, status.Error(codes.Internal, "agent runner broke the protocol: first message is not an ack")
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		drain(stream.Recv, cancel) // a refusal is the stream's one message
		return ack, nil, nil
	}
	msg, err := stream.Recv()
	if err == io.EOF {
		return nil, nil, status.Error(codes.Unavailable, "agent runner closed the stream after ACCEPTED without a result")
	}
	if err != nil {
		return nil, nil, err
	}
	if msg.GetResult() == nil {
		return nil, nil, status.Error(codes.Internal, "agent runner broke the protocol: second message is not a stage result")
	}
	drain(stream.Recv, cancel)
	return ack, msg.GetResult(), nil
}

// drainTimeout bounds the wait for the end of a Deliver stream after its last message.
var drainTimeout = 2 * time.Second

// drain reads the stream's end after its last message (the runner returns right after it,
// so the trailers are already on the way) rather than cancel the stream: the call then ends
// OK on both sides, in the client's span and metrics too, instead of Canceled, and the
// connection carries no RST_STREAM. A runner that keeps the stream open is not waited for
// longer than drainTimeout (cancel ends the wait); what it sent stands either way.
func drain[T any](recv func() (T, error), cancel context.CancelFunc) {
	t := time.AfterFunc(drainTimeout, cancel)
	recv()
	t.Stop()
}
