package rpc

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
)

type chainRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	log func(string)
}

func (r chainRunner) Deliver(_ *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	r.log("handler Deliver")
	return nil
}

// TestStreamChain: the stream chain runs its interceptors in order, each told the call's
// method, before the method's own handler, on every call of a registered method (its links
// kept after the first), of another registered method, and of a method no service
// registered (an unknown-service handler's, chained per call and never kept).
func TestStreamChain(t *testing.T) {
	var mu sync.Mutex
	var got []string
	log := func(s string) { mu.Lock(); got = append(got, s); mu.Unlock() }
	take := func() []string { mu.Lock(); defer mu.Unlock(); g := got; got = nil; return g }
	in := func(name string) grpc.StreamServerInterceptor {
		return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			log(name + " " + info.FullMethod)
			return handler(srv, ss)
		}
	}
	c := newStreamChain([]grpc.StreamServerInterceptor{in("a"), in("b"), in("c")})
	g := grpc.NewServer(grpc.StreamInterceptor(c.intercept), grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		log("handler unknown")
		return nil
	}))
	c.server.Store(g)
	handoffv1.RegisterAgentRunnerServiceServer(g, chainRunner{log: log})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	cc := testkit.Dial(t, testkit.ServeTCP(t, g))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	deliver := handoffv1.AgentRunnerService_Deliver_FullMethodName
	want := func(m, h string) []string { return []string{"a " + m, "b " + m, "c " + m, "handler " + h} }
	for i := range 3 {
		s, err := handoffv1.NewAgentRunnerServiceClient(cc).Deliver(ctx, &handoffv1.DeliverRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("Deliver %d: %v", i, err)
		}
		if g := take(); !slices.Equal(g, want(deliver, "Deliver")) {
			t.Fatalf("Deliver %d ran %v, want %v", i, g, want(deliver, "Deliver"))
		}
	}

	// Another registered stream method: its own links, its own method name.
	wctx, wcancel := context.WithCancel(ctx)
	w, err := healthpb.NewHealthClient(cc).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	wcancel()
	if g := take(); len(g) != 3 || !slices.Equal(g, want("/grpc.health.v1.Health/Watch", "")[:3]) {
		t.Fatalf("Watch ran %v", g)
	}

	const unknown = "/no.such.Service/Stream"
	for range 2 {
		us, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, unknown)
		if err != nil {
			t.Fatal(err)
		}
		if err := us.SendMsg(&handoffv1.DeliverRequest{}); err != nil {
			t.Fatal(err)
		}
		us.CloseSend()
		if err := us.RecvMsg(&handoffv1.DeliverResponse{}); !errors.Is(err, io.EOF) {
			t.Fatalf("unknown method: %v", err)
		}
		if g := take(); !slices.Equal(g, want(unknown, "unknown")) {
			t.Fatalf("unknown method ran %v, want %v", g, want(unknown, "unknown"))
		}
	}
	var kept []string
	c.chains.Range(func(k, _ any) bool { kept = append(kept, k.(string)); return true })
	slices.Sort(kept)
	if !slices.Equal(kept, []string{"/grpc.health.v1.Health/Watch", deliver}) {
		t.Fatalf("kept chains %v; want the two registered methods called, never the unknown one", kept)
	}
}
