package rpc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/test/bufconn"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// stubRunner answers every Deliver with an ACCEPTED ack and a result (or only a refusal for
// job "refuse"), then, when hold is set, keeps the stream open until the client leaves.
type stubRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	hold bool
}

func (r *stubRunner) Deliver(req *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	st := handoffv1.AckStatus_ACK_STATUS_ACCEPTED
	if req.GetPackage().GetJobId() == "refuse" {
		st = handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA
	}
	if err := s.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: &handoffv1.Ack{Status: st}}}); err != nil {
		return err
	}
	if st == handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		res := &handoffv1.StageResult{Status: handoffv1.StageStatus_STAGE_STATUS_COMPLETED}
		if err := s.Send(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: res}}); err != nil {
			return err
		}
	}
	if r.hold {
		<-s.Context().Done()
	}
	return nil
}

// endErrors records how each client call ended.
type endErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *endErrors) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (e *endErrors) HandleRPC(_ context.Context, s stats.RPCStats) {
	if end, ok := s.(*stats.End); ok {
		e.mu.Lock()
		e.errs = append(e.errs, end.Error)
		e.mu.Unlock()
	}
}
func (e *endErrors) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (e *endErrors) HandleConn(context.Context, stats.ConnStats)                       {}

func stubClient(t *testing.T, r *stubRunner, ends *endErrors) handoffv1.AgentRunnerServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	handoffv1.RegisterAgentRunnerServiceServer(g, r)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient("passthrough:///stub",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(ends))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return handoffv1.NewAgentRunnerServiceClient(cc)
}

// TestDeliverEndsCleanly: Deliver reads the stream to its end instead of cancelling it, so
// every call, accepted or refused, ends OK on the client too.
func TestDeliverEndsCleanly(t *testing.T) {
	ends := &endErrors{}
	c := stubClient(t, &stubRunner{}, ends)
	for i := range 20 {
		job := "job"
		if i%4 == 0 {
			job = "refuse"
		}
		ack, res, err := Deliver(context.Background(), c, &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: job}})
		if err != nil || ack == nil || (job == "job") != (res != nil) {
			t.Fatalf("Deliver %d = %v, %v, %v", i, ack, res, err)
		}
	}
	ends.mu.Lock()
	defer ends.mu.Unlock()
	if len(ends.errs) != 20 {
		t.Fatalf("%d calls ended, want 20", len(ends.errs))
	}
	for i, err := range ends.errs {
		if err != nil {
			t.Errorf("call %d ended with %v on the client; want OK (the stream read to its end)", i, err)
		}
	}
}

// TestDeliverDoesNotWaitForeverForTheEnd: a runner that keeps the stream open after its
// result costs drainTimeout, and the result is still returned.
func TestDeliverDoesNotWaitForeverForTheEnd(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = 50 * time.Millisecond
	c := stubClient(t, &stubRunner{hold: true}, &endErrors{})
	start := time.Now()
	ack, res, err := Deliver(context.Background(), c, &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "job"}})
	if err != nil || ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
		t.Fatalf("Deliver = %v, %v, %v; want the ack and the result", ack, res, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Deliver took %v with a runner that never ends its stream; want about drainTimeout", d)
	}
}
