package agentrunner_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// TestDeliverTwoRequests: Deliver is server-streaming, one request. A client that sends two
// (the second for another stage) gets an error and no Ack: the chain never runs on one
// request and the agent on the other, and no stage is claimed (the first one delivers
// normally afterwards).
func TestDeliverTwoRequests(t *testing.T) {
	draft := &fake{card: agentrunner.RoleCard{Name: "draft"}}
	review := &fake{card: agentrunner.RoleCard{Name: "review"}}
	e := start(t, agentrunner.Options{Agents: []agentrunner.Agent{draft, review}}, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, handoffv1.AgentRunnerService_Deliver_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"draft", "review"} {
		if err := s.SendMsg(&handoffv1.DeliverRequest{Package: pkg(stage)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var got []*handoffv1.DeliverResponse
	for {
		m := &handoffv1.DeliverResponse{}
		if err = s.RecvMsg(m); err != nil {
			break
		}
		got = append(got, m)
	}
	if status.Code(err) != codes.Internal || len(got) != 0 {
		t.Fatalf("two requests on Deliver: %d messages %v, end %v; want none and Internal", len(got), got, err)
	}
	if n, m := draft.calls.Load(), review.calls.Load(); n != 0 || m != 0 {
		t.Fatalf("agents ran (draft %d, review %d) for a stream of two requests", n, m)
	}
	msgs, err := deliver(t, e.client, &handoffv1.DeliverRequest{Package: pkg("draft")})
	if err != nil || len(msgs) != 2 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED ||
		msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("the first request alone afterwards: %v, %v; want ACCEPTED then COMPLETED", msgs, err)
	}
}
