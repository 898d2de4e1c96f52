package agentrunner_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/testkit"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// plainStream hides the hop.Holder of the stream it wraps: a handler behind it can only
// RecvMsg.
type plainStream struct{ grpc.ServerStream }

// TestDeliverHandlerReceive: over gRPC through the runner's whole chain, Deliver's handler
// runs the agent on the very request the last interceptor holds (no copy of the package);
// behind a stream that holds none it receives its own copy with RecvMsg, and the hop is the
// same.
func TestDeliverHandlerReceive(t *testing.T) {
	for _, held := range []bool{true, false} {
		var mu sync.Mutex
		var seen, got *handoffv1.HandoffPackage
		ag := &fake{card: agentrunner.RoleCard{Name: "draft"}, run: func(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
			mu.Lock()
			got = in.Package
			mu.Unlock()
			return &handoffv1.StageResult{NextHint: "next"}, nil
		}}
		st, err := store.Open(filepath.Join(t.TempDir(), "s.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		arts, err := artifact.NewFiles(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		srv, err := agentrunner.New(agentrunner.Options{Store: st, Artifacts: arts, Agents: []agentrunner.Agent{ag}, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		svc := srv.Service()
		// A probe behind the runner's interceptors: it takes the request they hold, keeps its
		// package, and holds it for the handler (or hides that it does).
		svc.Stream = append(svc.Stream, func(s any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			m, err := hop.Receive(ss, &handoffv1.DeliverRequest{})
			if err != nil {
				return err
			}
			mu.Lock()
			seen = m.(*handoffv1.DeliverRequest).GetPackage()
			mu.Unlock()
			var next grpc.ServerStream = hop.NewReplayStream(ss, m, "probe")
			if !held {
				next = plainStream{next}
			}
			return handler(s, next)
		})
		gs, err := server.New(svc, server.WithoutIdentity(), server.WithLogger(log))
		if err != nil {
			t.Fatal(err)
		}
		c := handoffv1.NewAgentRunnerServiceClient(testkit.Serve(t, gs))
		sent := pkg("draft")
		msgs, err := deliver(t, c, &handoffv1.DeliverRequest{Package: sent})
		if err != nil || len(msgs) != 2 || msgs[0].GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED ||
			msgs[1].GetResult().GetStatus() != handoffv1.StageStatus_STAGE_STATUS_COMPLETED {
			t.Fatalf("held=%v: %v %v; want ACCEPTED then COMPLETED", held, msgs, err)
		}
		mu.Lock()
		if seen == nil || got == nil {
			t.Fatalf("held=%v: probe saw %v, agent got %v", held, seen, got)
		}
		if same := got == seen; same != held {
			t.Errorf("held=%v: the agent's package is the interceptors' own: %v", held, same)
		}
		if !proto.Equal(got, seen) || got.GetJobId() != sent.GetJobId() || got.GetGoal() != sent.GetGoal() {
			t.Errorf("held=%v: the agent got %v, the chain held %v", held, got, seen)
		}
		mu.Unlock()
		gs.Stop()
	}
}
