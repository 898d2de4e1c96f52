package rpc_test

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/testkit"
)

// TestGracefulStopWithStreamsOnWorkers: long streams hold every stream worker and more
// (as WatchJob streams would); a graceful stop waits for all of them, on the workers and
// beyond, and a new stream meanwhile is refused rather than queued; once the stop returns,
// the server's goroutines, its kept workers included, are gone.
func TestGracefulStopWithStreamsOnWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	srv, r, cc, served := holdServer(t, server.WithStopTimeout(20*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	calls := holdAll(t, ctx, cc, r, rpc.StreamWorkers()+3)
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("graceful stop returned with streams still in their handlers")
	default:
	}
	if err := <-hold(ctx, cc); err == nil {
		t.Error("a new stream during the graceful stop succeeded; want it refused")
	}
	close(r.release)
	for i, c := range calls {
		if err := <-c; err != nil {
			t.Errorf("call %d: %v; want it to finish", i, err)
		}
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("graceful stop did not return after the streams ended")
	}
	<-served
	cc.Close()
	testkit.Eventually(t, 10*time.Second, "the server's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestStopCutsStreamsOnWorkers: a hard stop with streams held on the stream workers and
// beyond them cuts every one (each call ends with an error), and leaves none of the server's
// goroutines, its 64 kept workers included.
func TestStopCutsStreamsOnWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	srv, r, cc, served := holdServer(t)
	defer close(r.release)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	calls := holdAll(t, ctx, cc, r, rpc.StreamWorkers()+3)
	srv.Stop()
	for i, c := range calls {
		if err := <-c; err == nil {
			t.Errorf("call %d ended cleanly; want it cut by the stop", i)
		}
	}
	<-served
	cc.Close()
	waitFor(t, "every handler to return", func() bool { return r.in.Load() == 0 })
	testkit.Eventually(t, 10*time.Second, "the server's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// holdServer serves a holdRunner on an assembled server (no identity, quiet log) on a
// loopback port, with a client to it; served gets Serve's return.
func holdServer(t *testing.T, opts ...server.Option) (*server.Server, *holdRunner, *grpc.ClientConn, chan error) {
	t.Helper()
	r := &holdRunner{release: make(chan struct{})}
	srv, err := server.New(server.Service{Name: "workers", Register: func(g *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(g, r) }},
		append([]server.Option{server.WithoutIdentity(), server.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	return srv, r, testkit.Dial(t, lis.Addr().String()), served
}

// holdAll opens n streams that r's handler holds (until r.release closes) and waits until
// every one of them is in the handler; each channel gets its call's end.
func holdAll(t *testing.T, ctx context.Context, cc *grpc.ClientConn, r *holdRunner, n int) []<-chan error {
	t.Helper()
	var calls []<-chan error
	for range n {
		calls = append(calls, hold(ctx, cc))
	}
	waitFor(t, "every call in its handler", func() bool { return r.in.Load() == int64(n) })
	return calls
}
