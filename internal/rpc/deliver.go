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
// itself, as the coordinator does.
func Deliver(ctx context.Context, runner handoffv1.AgentRunnerServiceClient, req *handoffv1.DeliverRequest) (*handoffv1.Ack, *handoffv1.StageResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := runner.Deliver(ctx, req)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, nil, err
	}
	ack := first.GetAck()
	if ack == nil {
		cancel()
		return nil, nil, status.Error(codes.Internal, "agent runner broke the protocol: first message is not an ack")
	}
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		go finish(stream.Recv, cancel, drainTimeout) // a refusal is the stream's one message
		return ack, nil, nil
	}
	msg, err := stream.Recv()
	if err == io.EOF {
		cancel()
		return nil, nil, status.Error(codes.Unavailable, "agent runner closed the stream after ACCEPTED without a result")
	}
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if msg.GetResult() == nil {
		cancel()
		return nil, nil, status.Error(codes.Internal, "agent runner broke the protocol: second message is not a stage result")
	}
	go finish(stream.Recv, cancel, drainTimeout)
	return ack, msg.GetResult(), nil
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
