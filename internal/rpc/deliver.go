package rpc

import (
	"context"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Deliver is the client side of AgentRunnerService/Deliver: it sends one package and reads
// the Ack and, after ACCEPTED, the StageResult, then leaves the stream by cancelling it. Any
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
	return ack, msg.GetResult(), nil
}
