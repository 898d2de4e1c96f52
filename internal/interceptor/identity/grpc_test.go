package identity_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

// recorder counts handler runs and keeps the identities handlers saw.
type recorder struct {
	mu    sync.Mutex
	calls int
	ids   []identity.Identity
}

func (r *recorder) record(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if id, ok := identity.FromContext(ctx); ok {
		r.ids = append(r.ids, id)
	}
}

func (r *recorder) snapshot() (int, []identity.Identity) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, append([]identity.Identity(nil), r.ids...)
}

type writebackServer struct {
	handoffv1.UnimplementedWritebackServiceServer
	rec *recorder
}

func (s writebackServer) Write(ctx context.Context, _ *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	s.rec.record(ctx)
	return &handoffv1.WriteResponse{}, nil
}

type runnerServer struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	rec *recorder
}

func (s runnerServer) Deliver(_ *handoffv1.DeliverRequest, stream grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	s.rec.record(stream.Context())
	return stream.Send(&handoffv1.DeliverResponse{})
}

type coordinatorServer struct {
	handoffv1.UnimplementedCoordinatorServiceServer
	rec *recorder
}

func (s coordinatorServer) SubmitJob(ctx context.Context, _ *handoffv1.SubmitJobRequest) (*handoffv1.SubmitJobResponse, error) {
	s.rec.record(ctx)
	return &handoffv1.SubmitJobResponse{}, nil
}

func (s coordinatorServer) GetJob(ctx context.Context, _ *handoffv1.GetJobRequest) (*handoffv1.GetJobResponse, error) {
	s.rec.record(ctx)
	return &handoffv1.GetJobResponse{}, nil
}

// serve starts a server on 127.0.0.1:0 with the three (fake) services, health and
// reflection behind the identity interceptors, and returns its address.
func serve(t *testing.T, creds credentials.TransportCredentials, opts ...identity.Option) (string, *recorder) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(identity.UnaryServerInterceptor(opts...)),
		grpc.ChainStreamInterceptor(identity.StreamServerInterceptor(opts...)))
	rec := &recorder{}
	handoffv1.RegisterWritebackServiceServer(g, writebackServer{rec: rec})
	handoffv1.RegisterAgentRunnerServiceServer(g, runnerServer{rec: rec})
	handoffv1.RegisterCoordinatorServiceServer(g, coordinatorServer{rec: rec})
	healthpb.RegisterHealthServer(g, health.NewServer())
	reflection.Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String(), rec
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// deliver calls the server-streaming Deliver and reads the stream to its end.
func deliverCall(ctx context.Context, cc *grpc.ClientConn) error {
	stream, err := handoffv1.NewAgentRunnerServiceClient(cc).Deliver(ctx, &handoffv1.DeliverRequest{})
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func writeCall(ctx context.Context, cc *grpc.ClientConn) error {
	_, err := handoffv1.NewWritebackServiceClient(cc).Write(ctx, &handoffv1.WriteRequest{})
	return err
}

func TestMTLSOverLoopback(t *testing.T) {
	dir, otherDir := t.TempDir(), t.TempDir()
	if err := certs.Generate(dir, certs.DefaultServices, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := certs.Generate(otherDir, []string{"coordinator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	srvTLS, err := certs.ServerTLS(dir, "writeback")
	if err != nil {
		t.Fatal(err)
	}
	addr, rec := serve(t, credentials.NewTLS(srvTLS), identity.WithPolicy(identity.DefaultPolicy()))
	clientTLS := func(dir, svc string) *tls.Config {
		cfg, err := certs.ClientTLS(dir, svc)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	noCert := clientTLS(dir, "coordinator")
	noCert.Certificates = nil
	foreign := clientTLS(otherDir, "coordinator") // its own CA's coordinator
	foreign.RootCAs = clientTLS(dir, "coordinator").RootCAs

	tests := []struct {
		name string
		tls  *tls.Config
		call func(context.Context, *grpc.ClientConn) error
		code codes.Code
		msg  []string
		want identity.Identity
	}{
		{name: "coordinator writes", tls: clientTLS(dir, "coordinator"), call: writeCall,
			want: identity.Identity{Service: "coordinator", Method: "mtls"}},
		{name: "agentrunner may not write", tls: clientTLS(dir, "agentrunner"), call: writeCall, code: codes.PermissionDenied,
			msg: []string{`caller "agentrunner" (mtls) may not call /handoff.v1.WritebackService/Write; allowed callers: coordinator`}},
		{name: "operator may not write", tls: clientTLS(dir, "operator"), call: writeCall, code: codes.PermissionDenied},
		{name: "operator delivers (stream)", tls: clientTLS(dir, "operator"), call: deliverCall,
			want: identity.Identity{Service: "operator", Method: "mtls"}},
		{name: "writeback may not deliver (stream)", tls: clientTLS(dir, "writeback"), call: deliverCall, code: codes.PermissionDenied,
			msg: []string{`caller "writeback"`, "/handoff.v1.AgentRunnerService/Deliver", "coordinator, operator"}},
		{name: "no client certificate: handshake fails", tls: noCert, call: writeCall, code: codes.Unavailable},
		{name: "certificate from another CA: rejected", tls: foreign, call: writeCall, code: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := rec.snapshot()
			cc := dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(tt.tls)))
			err := tt.call(testContext(t), cc)
			if status.Code(err) != tt.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tt.code)
			}
			for _, m := range tt.msg {
				if !strings.Contains(status.Convert(err).Message(), m) {
					t.Errorf("message %q lacks %q", status.Convert(err).Message(), m)
				}
			}
			after, ids := rec.snapshot()
			if tt.code != codes.OK {
				if after != before {
					t.Error("the handler ran for a refused call")
				}
				return
			}
			if after != before+1 || ids[len(ids)-1] != tt.want {
				t.Errorf("handler runs %d->%d, identity %v, want %+v", before, after, ids, tt.want)
			}
		})
	}

	// The client refuses a server whose certificate another CA signed.
	t.Run("server from another CA", func(t *testing.T) {
		cfg := clientTLS(dir, "coordinator")
		cfg.RootCAs = clientTLS(otherDir, "coordinator").RootCAs
		cc := dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		err := writeCall(testContext(t), cc)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("err %v, want Unavailable naming the certificate", err)
		}
	})
}

func TestTokensOverPlaintextLoopback(t *testing.T) {
	s := newSigner(t, 1)
	addr, rec := serve(t, insecure.NewCredentials(), identity.WithPolicy(identity.DefaultPolicy()), identity.WithSigner(s))
	plain := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	agentTok := s.Token("agentrunner", time.Minute)

	tests := []struct {
		name string
		conn *grpc.ClientConn // default: plain, with the raw authorization value below
		auth string
		call func(context.Context, *grpc.ClientConn) error
		code codes.Code
		msg  string
		want identity.Identity
	}{
		{name: "valid (PerRPCCredentials)", call: writeCall,
			conn: dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(s.PerRPCCredentials("coordinator"))),
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "valid stream", call: deliverCall, auth: "Bearer " + s.Token("coordinator", time.Minute),
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "valid but not allowed", call: writeCall, auth: "Bearer " + agentTok, code: codes.PermissionDenied, msg: `caller "agentrunner" (token)`},
		{name: "expired", call: writeCall, auth: "Bearer " + s.Token("coordinator", -time.Minute), code: codes.Unauthenticated, msg: "service token expired"},
		{name: "wrong key", call: writeCall, auth: "Bearer " + newSigner(t, 2).Token("coordinator", time.Minute), code: codes.Unauthenticated, msg: "signature does not match"},
		{name: "tampered service", call: writeCall, auth: "Bearer " + strings.Replace(agentTok, ".agentrunner.", ".coordinator.", 1), code: codes.Unauthenticated, msg: "signature does not match"},
		{name: "malformed", call: writeCall, auth: "Bearer hst1.coordinator.notatime.sig", code: codes.Unauthenticated, msg: "malformed service token"},
		{name: "malformed on a stream", call: deliverCall, auth: "Bearer hst1.", code: codes.Unauthenticated, msg: "malformed service token"},
		{name: "no token", call: writeCall, code: codes.Unauthenticated, msg: "no caller identity: present a client certificate or a service token"},
		{name: "no token on a stream", call: deliverCall, code: codes.Unauthenticated, msg: "no caller identity"},
		{name: "anonymous may not read jobs", call: func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := handoffv1.NewCoordinatorServiceClient(cc).GetJob(ctx, &handoffv1.GetJobRequest{})
			return err
		}, code: codes.Unauthenticated, msg: "no caller identity"},
		{name: "anyone may submit", call: func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := handoffv1.NewCoordinatorServiceClient(cc).SubmitJob(ctx, &handoffv1.SubmitJobRequest{})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := rec.snapshot()
			cc, ctx := tt.conn, testContext(t)
			if cc == nil {
				cc = plain
			}
			if tt.auth != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tt.auth)
			}
			err := tt.call(ctx, cc)
			if status.Code(err) != tt.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tt.code)
			}
			if !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Errorf("message %q lacks %q", status.Convert(err).Message(), tt.msg)
			}
			after, ids := rec.snapshot()
			if tt.code != codes.OK {
				if after != before {
					t.Error("the handler ran for a refused call")
				}
				return
			}
			if after != before+1 {
				t.Fatalf("handler runs %d->%d", before, after)
			}
			if tt.want != (identity.Identity{}) && ids[len(ids)-1] != tt.want {
				t.Errorf("identity %v, want %+v", ids, tt.want)
			}
		})
	}
}

func TestHealthAndReflectionOpenWithoutIdentity(t *testing.T) {
	// A policy that names nobody: health and reflection stay open all the same.
	addr, _ := serve(t, insecure.NewCredentials(), identity.WithPolicy(identity.Policy{}))
	cc := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	ctx := testContext(t)

	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}

	v1, err := reflectionv1.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := v1.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r1, err := v1.Recv()
	if err != nil {
		t.Fatalf("reflection v1: %v", err)
	}
	var names []string
	for _, s := range r1.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, " "), "handoff.v1.WritebackService") {
		t.Errorf("reflection v1 list: %v", names)
	}

	v1a, err := reflectionv1alpha.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := v1a.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if r, err := v1a.Recv(); err != nil || len(r.GetListServicesResponse().GetService()) == 0 {
		t.Fatalf("reflection v1alpha: %v %v", r, err)
	}

	// And the services themselves are closed.
	if err := writeCall(ctx, cc); status.Code(err) != codes.Unauthenticated {
		t.Errorf("write without identity: %v", err)
	}
}
