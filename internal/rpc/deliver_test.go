package rpc

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
)

// stubRunner answers every Deliver with an ACCEPTED ack and a result (or only a refusal for
// job "refuse"), then, when hold is set, keeps the stream open until the client leaves and
// closes released.
type stubRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	hold     bool
	released chan struct{}
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
		close(r.released)
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

// wait returns how the first n calls ended, once n have (their ends are read in the
// background, after Deliver returned).
func (e *endErrors) wait(t *testing.T, n int) []error {
	t.Helper()
	var errs []error
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d calls to end", n), func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		errs = slices.Clone(e.errs)
		return len(errs) >= n
	})
	return errs[:n]
}

func (e *endErrors) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (e *endErrors) HandleConn(context.Context, stats.ConnStats)                       {}

func stubClient(t *testing.T, r handoffv1.AgentRunnerServiceServer, ends *endErrors) handoffv1.AgentRunnerServiceClient {
	t.Helper()
	g := grpc.NewServer()
	handoffv1.RegisterAgentRunnerServiceServer(g, r)
	return handoffv1.NewAgentRunnerServiceClient(testkit.Serve(t, g, grpc.WithStatsHandler(ends)))
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
	for i, err := range ends.wait(t, 20) {
		if err != nil {
			t.Errorf("call %d ended with %v on the client; want OK (the stream read to its end)", i, err)
		}
	}
}

// TestDeliverReturnsBeforeTheEnd: Deliver returns the result as soon as it is in, while
// the runner still holds its stream open (it stores the completion after sending it).
func TestDeliverReturnsBeforeTheEnd(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = time.Hour // the end is not waited for, however long it may take
	c := stubClient(t, &stubRunner{hold: true, released: make(chan struct{})}, &endErrors{})
	type answer struct {
		ack *handoffv1.Ack
		res *handoffv1.StageResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		ack, res, err := Deliver(context.Background(), c, &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "job"}})
		got <- answer{ack, res, err}
	}()
	select {
	case a := <-got:
		if a.err != nil || a.ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED || a.res.GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
			t.Fatalf("Deliver = %v, %v, %v; want the ack and the result", a.ack, a.res, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Deliver did not return while the runner held its stream open after the result")
	}
}

// TestDeliverEndsAHeldStream: a runner that keeps the stream open after its result has it
// ended once drainTimeout passes, rather than kept forever.
func TestDeliverEndsAHeldStream(t *testing.T) {
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = 50 * time.Millisecond
	r := &stubRunner{hold: true, released: make(chan struct{})}
	c := stubClient(t, r, &endErrors{})
	if _, res, err := Deliver(context.Background(), c, &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "job"}}); err != nil || res == nil {
		t.Fatalf("Deliver = %v, %v; want the result", res, err)
	}
	select {
	case <-r.released:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream was never ended: a runner that holds it open would keep it forever")
	}
}

// slowEnd is a stubRunner whose stream ends a moment after its result, as the runner's
// does when it stores the completion after sending it.
type slowEnd struct{ stubRunner }

func (r *slowEnd) Deliver(req *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	if err := r.stubRunner.Deliver(req, s); err != nil {
		return err
	}
	time.Sleep(5 * time.Millisecond)
	return nil
}

// TestDeliverOutlivesItsCallersContext: callers cancel their context as soon as Deliver
// returns (the coordinator's retry does); the stream still ends OK, not Canceled, when its
// end comes after that.
func TestDeliverOutlivesItsCallersContext(t *testing.T) {
	ends := &endErrors{}
	c := stubClient(t, &slowEnd{}, ends)
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, res, err := Deliver(ctx, c, &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "job"}})
		cancel()
		if err != nil || res == nil {
			t.Fatalf("Deliver %d = %v, %v", i, res, err)
		}
	}
	for i, err := range ends.wait(t, 10) {
		if err != nil {
			t.Errorf("call %d ended with %v; want OK (the caller's cancel after the result must not end it)", i, err)
		}
	}
}

// TestDeliverHonoursItsCallersContext: until the last message is in, the caller's deadline
// ends the call.
func TestDeliverHonoursItsCallersContext(t *testing.T) {
	c := stubClient(t, &holdFirst{}, &endErrors{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := Deliver(ctx, c, &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "job"}})
		done <- err
	}()
	select {
	case err := <-done:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Deliver = %v; want DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Deliver ignored its caller's deadline while waiting for the ack")
	}
}

// holdFirst never answers until the client leaves.
type holdFirst struct{ stubRunner }

func (r *holdFirst) Deliver(_ *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	<-s.Context().Done()
	return nil
}
