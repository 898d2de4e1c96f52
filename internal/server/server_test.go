package server_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/telemetry"
	"github.com/handoffhq/handoff/internal/testkit"
)

var quiet = slog.New(slog.DiscardHandler)

// runner is an AgentRunnerService whose Deliver stays in its handler until its call ends
// (or release closes), and whose Check answers at once.
type runner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	in      atomic.Int32
	release chan struct{}
}

func (r *runner) Deliver(_ *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	r.in.Add(1)
	select {
	case <-s.Context().Done():
	case <-r.release:
	}
	return nil
}

func (r *runner) Check(context.Context, *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	return &handoffv1.CheckResponse{}, nil
}

// deliver starts a Deliver on cc; the channel gets how it ended (io.EOF: finished).
func deliver(cc *grpc.ClientConn) <-chan error {
	ended := make(chan error, 1)
	go func() {
		s, err := handoffv1.NewAgentRunnerServiceClient(cc).Deliver(context.Background(), &handoffv1.DeliverRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		ended <- err
	}()
	return ended
}

func service(r *runner) server.Service {
	return server.Service{Name: "runner", Register: func(g *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(g, r) }}
}

// pinger is a store whose Ping fails while fail is set.
type pinger struct{ fail atomic.Bool }

func (p *pinger) Ping(context.Context) error {
	if p.fail.Load() {
		return errors.New("connection refused")
	}
	return nil
}

func healthOf(t *testing.T, cc *grpc.ClientConn, svc string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatalf("health %q: %v", svc, err)
	}
	return resp.GetStatus()
}

// Health follows the store: NOT_SERVING for "" and every registered service while its Ping
// fails, SERVING again once it answers; after Drain it stays NOT_SERVING while calls are
// still served.
func TestHealthFollowsTheStore(t *testing.T) {
	st := &pinger{}
	srv, err := server.New(service(&runner{}), server.WithoutIdentity(), server.WithLogger(quiet), server.WithHealthFrom(st, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cc := testkit.Serve(t, srv)
	names := []string{"", handoffv1.AgentRunnerService_ServiceDesc.ServiceName}
	all := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			for _, n := range names {
				if healthOf(t, cc, n) != want {
					return false
				}
			}
			return true
		}
	}
	if !all(healthpb.HealthCheckResponse_SERVING)() {
		t.Fatal("not SERVING at the start")
	}
	st.fail.Store(true)
	testkit.Eventually(t, 5*time.Second, "NOT_SERVING while the store's Ping fails", all(healthpb.HealthCheckResponse_NOT_SERVING))
	st.fail.Store(false)
	testkit.Eventually(t, 5*time.Second, "SERVING once the store answers again", all(healthpb.HealthCheckResponse_SERVING))

	srv.Drain()
	if !all(healthpb.HealthCheckResponse_NOT_SERVING)() {
		t.Fatal("SERVING after Drain")
	}
	time.Sleep(60 * time.Millisecond) // a few store checks: none may turn it back
	if !all(healthpb.HealthCheckResponse_NOT_SERVING)() {
		t.Fatal("a store check after Drain set health back to SERVING")
	}
	if _, err := handoffv1.NewAgentRunnerServiceClient(cc).Check(context.Background(), &handoffv1.CheckRequest{}); err != nil {
		t.Fatalf("a call after Drain: %v; draining must not refuse calls yet", err)
	}
}

// GracefulStop waits for calls in flight at most the stop timeout, then cuts them; the
// drain funcs run first, with health already NOT_SERVING.
func TestGracefulStopIsBounded(t *testing.T) {
	r := &runner{release: make(chan struct{})}
	const bound = 300 * time.Millisecond
	var drained atomic.Bool
	srv, err := server.New(service(r), server.WithoutIdentity(), server.WithLogger(quiet), server.WithStopTimeout(bound),
		server.WithDrain(func() { drained.Store(true) }))
	if err != nil {
		t.Fatal(err)
	}
	cc := testkit.Serve(t, srv)
	ended := deliver(cc)
	testkit.Eventually(t, 5*time.Second, "the call to reach its handler", func() bool { return r.in.Load() == 1 })
	start := time.Now()
	srv.GracefulStop()
	took := time.Since(start)
	if took < bound || took > bound+5*time.Second {
		t.Errorf("GracefulStop took %s with a call that never ends; want about the bound %s", took, bound)
	}
	if !drained.Load() {
		t.Error("the drain func did not run")
	}
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
			t.Errorf("the cut call ended with %v; want Unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call in flight was not cut")
	}
}

// A call that finishes within the bound is not cut: GracefulStop returns once it ends.
func TestGracefulStopLetsCallsFinish(t *testing.T) {
	r := &runner{release: make(chan struct{})}
	srv, err := server.New(service(r), server.WithoutIdentity(), server.WithLogger(quiet), server.WithStopTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cc := testkit.Serve(t, srv)
	ended := deliver(cc)
	testkit.Eventually(t, 5*time.Second, "the call to reach its handler", func() bool { return r.in.Load() == 1 })
	time.AfterFunc(100*time.Millisecond, func() { close(r.release) })
	start := time.Now()
	srv.GracefulStop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("GracefulStop took %s", took)
	}
	if err := <-ended; !errors.Is(err, io.EOF) {
		t.Errorf("the call ended with %v; want it finished (EOF)", err)
	}
}

// A server is never assembled without an identity check by accident, and the check is in
// the chain: an anonymous call is refused while health and reflection stay open.
func TestIdentityIsInTheChain(t *testing.T) {
	if _, err := server.New(service(&runner{})); !errors.Is(err, server.ErrNoIdentity) {
		t.Fatalf("New without security = %v; want ErrNoIdentity", err)
	}
	authz := identity.NewAuthorizer(identity.WithPolicy(identity.DefaultPolicy()))
	srv, err := server.New(server.Service{Name: "agentrunner", Register: func(g *grpc.Server) {
		handoffv1.RegisterAgentRunnerServiceServer(g, &runner{})
	}}, server.WithSecurity(nil, authz), server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	cc := testkit.Serve(t, srv)
	s, err := handoffv1.NewAgentRunnerServiceClient(cc).Deliver(context.Background(), &handoffv1.DeliverRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous Deliver = %v; want Unauthenticated", err)
	}
	if s := healthOf(t, cc, ""); s != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %s; want SERVING and open", s)
	}
	if _, ok := srv.GRPC().GetServiceInfo()["grpc.reflection.v1.ServerReflection"]; !ok {
		t.Error("reflection is not registered")
	}
}

// Metrics are registered under the service's name with every method's series from the
// start, and the endpoint serves them with the shared timeouts.
func TestMetrics(t *testing.T) {
	reg := telemetry.NewRegistry()
	srv, err := server.New(service(&runner{}), server.WithoutIdentity(), server.WithLogger(quiet), server.WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	cc := testkit.Serve(t, srv)
	if _, err := handoffv1.NewAgentRunnerServiceClient(cc).Check(context.Background(), &handoffv1.CheckRequest{}); err != nil {
		t.Fatal(err)
	}
	m, err := server.ServeMetrics("metrics-listen", "127.0.0.1:0", reg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	resp, err := http.Get(m.URL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Check",grpc_service="handoff.v1.AgentRunnerService",grpc_type="unary",service="runner"} 1`,
		`grpc_server_started_total{grpc_method="Deliver",grpc_service="handoff.v1.AgentRunnerService",grpc_type="server_stream",service="runner"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	hs := server.NewMetricsServer(reg)
	if hs.ReadHeaderTimeout != server.MetricsReadHeaderTimeout || hs.WriteTimeout != server.MetricsWriteTimeout || hs.IdleTimeout != server.MetricsIdleTimeout {
		t.Errorf("metrics server timeouts %s/%s/%s; want the shared ones", hs.ReadHeaderTimeout, hs.WriteTimeout, hs.IdleTimeout)
	}
	if _, err := server.ServeMetrics("metrics-listen", m.Addr().String(), reg, quiet); err == nil || !strings.Contains(err.Error(), "--metrics-listen") {
		t.Errorf("a taken port = %v; want an error naming --metrics-listen", err)
	}
}

// Run serves until its context ends and returns nil after the graceful stop.
func TestRunStopsWithItsContext(t *testing.T) {
	srv, err := server.New(service(&runner{}), server.WithoutIdentity(), server.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	lis := listen(t)
	go func() { done <- srv.Run(ctx, lis) }()
	cc := testkit.Dial(t, lis.Addr().String())
	if s := healthOf(t, cc, ""); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %s", s)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after its context ended; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// With an identity check, the assembly gives callers without a service identity their own
// pool of calls (rpc.Limits.MaxAnonymousStreams) in every binary, not only under `handoff
// up`: anonymous callers filling theirs leave the services room.
func TestAnonymousCallersHaveTheirOwnPool(t *testing.T) {
	coord, err := identity.GenerateSigner("coordinator")
	if err != nil {
		t.Fatal(err)
	}
	v, err := identity.NewVerifier("agentrunner", map[string]ed25519.PublicKey{"coordinator": coord.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	authz := identity.NewAuthorizer(identity.WithVerifier(v), identity.WithPolicy(identity.DefaultPolicy()))
	srv, err := server.New(server.Service{Name: "agentrunner", Register: func(g *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(g, &runner{}) }},
		server.WithSecurity(nil, authz), server.WithLogger(quiet),
		server.WithLimits(rpc.Limits{MaxStreams: 8, MaxAnonymousStreams: 1, RequestTimeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	anon := testkit.Serve(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// An anonymous call that never sends its request holds the anonymous pool's one slot.
	if _, err := anon.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, handoffv1.AgentRunnerService_Check_FullMethodName); err != nil {
		t.Fatal(err)
	}
	client := handoffv1.NewAgentRunnerServiceClient(anon)
	var err2 error
	testkit.Eventually(t, 5*time.Second, "the anonymous pool to be full", func() bool {
		_, err2 = client.Check(ctx, &handoffv1.CheckRequest{})
		return status.Code(err2) == codes.ResourceExhausted
	})
	if !strings.Contains(err2.Error(), "without a service identity") {
		t.Fatalf("second anonymous call: %v; want the anonymous pool named", err2)
	}
	svc := handoffv1.NewAgentRunnerServiceClient(testkit.Serve(t, srv, grpc.WithPerRPCCredentials(coord.PerRPCCredentials())))
	if _, err := svc.Check(ctx, &handoffv1.CheckRequest{}); err != nil {
		t.Fatalf("the coordinator's call while the anonymous pool is full: %v", err)
	}
}
