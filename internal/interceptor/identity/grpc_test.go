package identity_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/testkit"
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

// serve starts a server on 127.0.0.1:0 with the three (fake) services behind the identity
// check, assembled as a service's server is (internal/server: health and reflection
// included), and returns its address.
func serve(t *testing.T, creds credentials.TransportCredentials, opts ...identity.Option) (string, *recorder) {
	t.Helper()
	rec := &recorder{}
	srv, err := server.New(server.Service{Name: "identity-test", Register: func(g *grpc.Server) {
		handoffv1.RegisterWritebackServiceServer(g, writebackServer{rec: rec})
		handoffv1.RegisterAgentRunnerServiceServer(g, runnerServer{rec: rec})
		handoffv1.RegisterCoordinatorServiceServer(g, coordinatorServer{rec: rec})
	}}, server.WithSecurity(creds, identity.NewAuthorizer(opts...)), server.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return testkit.ServeTCP(t, srv), rec
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
			cc := testkit.Dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(tt.tls)))
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
		cc := testkit.Dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		err := writeCall(testContext(t), cc)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("err %v, want Unavailable naming the certificate", err)
		}
	})
}

// TestTokensOverPlaintextLoopback serves each service on its own loopback server whose
// verifier holds the four services' public keys and checks tokens for that service, as the
// binaries and `handoff up` run them, and calls them over real gRPC.
func TestTokensOverPlaintextLoopback(t *testing.T) {
	r := newRing(t)
	addrs, recs := map[string]string{}, map[string]*recorder{}
	for _, svc := range []string{"writeback", "agentrunner", "coordinator"} {
		addrs[svc], recs[svc] = serve(t, insecure.NewCredentials(), identity.WithPolicy(identity.DefaultPolicy()), identity.WithVerifier(r.verifier(t, svc)))
	}
	plain := func(svc string) *grpc.ClientConn {
		return testkit.Dial(t, addrs[svc], grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	as := func(svc, caller string) *grpc.ClientConn {
		return testkit.Dial(t, addrs[svc], grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(r[caller].PerRPCCredentials()))
	}
	forged := func(key ed25519.PrivateKey) *identity.Signer { // someone's key, claiming to be the coordinator
		s, err := identity.NewSigner("coordinator", key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	now := time.Now().Unix()
	coord := r["coordinator"]
	getJob := func(ctx context.Context, cc *grpc.ClientConn) error {
		_, err := handoffv1.NewCoordinatorServiceClient(cc).GetJob(ctx, &handoffv1.GetJobRequest{})
		return err
	}

	tests := []struct {
		name string
		srv  string           // default writeback
		conn *grpc.ClientConn // default: plain to srv, with the raw authorization value below
		auth string
		call func(context.Context, *grpc.ClientConn) error
		code codes.Code
		msg  string
		want identity.Identity
	}{
		// One credentials object per caller reaches every service: the audience follows the call.
		{name: "coordinator writes (PerRPCCredentials)", call: writeCall, conn: as("writeback", "coordinator"),
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "coordinator delivers (PerRPCCredentials, stream)", srv: "agentrunner", call: deliverCall, conn: as("agentrunner", "coordinator"),
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "operator delivers (PerRPCCredentials)", srv: "agentrunner", call: deliverCall, conn: as("agentrunner", "operator"),
			want: identity.Identity{Service: "operator", Method: "token"}},
		{name: "operator reads a job (PerRPCCredentials)", srv: "coordinator", call: getJob, conn: as("coordinator", "operator"),
			want: identity.Identity{Service: "operator", Method: "token"}},
		{name: "agentrunner's own token may not write", call: writeCall, conn: as("writeback", "agentrunner"), code: codes.PermissionDenied, msg: `caller "agentrunner" (token)`},

		// Nobody mints another's identity: the verifier holds public keys only.
		{name: "writeback's key claiming coordinator", call: writeCall, auth: "Bearer " + token(t, forged(seededKey(3)), "writeback"),
			code: codes.Unauthenticated, msg: `signature does not verify (not signed by the issuer's key, or altered) (token from "coordinator")`},
		{name: "agentrunner's key claiming coordinator", call: writeCall, auth: "Bearer " + token(t, forged(seededKey(2)), "writeback"),
			code: codes.Unauthenticated, msg: "signature does not verify"},
		{name: "agentrunner's key claiming coordinator on Deliver", srv: "agentrunner", call: deliverCall, auth: "Bearer " + token(t, forged(seededKey(2)), "agentrunner"),
			code: codes.Unauthenticated, msg: "signature does not verify"},
		{name: "unknown issuer", call: writeCall, auth: "Bearer " + token(t, newRing(t, "intruder")["intruder"], "writeback"),
			code: codes.Unauthenticated, msg: `unknown issuer: "intruder"`},

		// A token is for one service.
		{name: "audience agentrunner on Write", call: writeCall, auth: "Bearer " + token(t, coord, "agentrunner"),
			code: codes.Unauthenticated, msg: `"coordinator"'s token is for "agentrunner", this is "writeback"`},
		{name: "audience writeback on Deliver", srv: "agentrunner", call: deliverCall, auth: "Bearer " + token(t, coord, "writeback"),
			code: codes.Unauthenticated, msg: `is for "writeback", this is "agentrunner"`},
		{name: "audience agentrunner on Deliver", srv: "agentrunner", call: deliverCall, auth: "Bearer " + token(t, coord, "agentrunner"),
			want: identity.Identity{Service: "coordinator", Method: "token"}},

		// A token lives at most MaxLifetime, with ClockSkew of leeway.
		{name: "expiry in 2286", call: writeCall, auth: "Bearer " + coord.Mint("writeback", now, time.Date(2286, 11, 20, 17, 46, 39, 0, time.UTC).Unix()),
			code: codes.Unauthenticated, msg: "last at most 10m0s"},
		{name: "issued an hour ahead", call: writeCall, auth: "Bearer " + coord.Mint("writeback", now+3600, now+3660),
			code: codes.Unauthenticated, msg: "issued in the future"},
		{name: "expired", call: writeCall, auth: "Bearer " + coord.Mint("writeback", now-600, now-120), code: codes.Unauthenticated, msg: "service token expired"},
		{name: "hst1 shared-key token", call: writeCall, auth: "Bearer hst1.coordinator.9999999999.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
			code: codes.Unauthenticated, msg: "no longer accepted"},
		{name: "tampered issuer", call: writeCall, auth: "Bearer " + strings.Replace(token(t, r["agentrunner"], "writeback"), ".agentrunner.", ".coordinator.", 1),
			code: codes.Unauthenticated, msg: "signature does not verify"},
		{name: "malformed on a stream", srv: "agentrunner", call: deliverCall, auth: "Bearer hst2.", code: codes.Unauthenticated, msg: "malformed service token"},
		{name: "no token", call: writeCall, code: codes.Unauthenticated, msg: "no caller identity: present a client certificate or a service token"},
		{name: "no token on a stream", srv: "agentrunner", call: deliverCall, code: codes.Unauthenticated, msg: "no caller identity"},
		{name: "anonymous may not read jobs", srv: "coordinator", call: getJob, code: codes.Unauthenticated, msg: "no caller identity"},
		{name: "anonymous may not submit", srv: "coordinator", call: func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := handoffv1.NewCoordinatorServiceClient(cc).SubmitJob(ctx, &handoffv1.SubmitJobRequest{})
			return err
		}, code: codes.Unauthenticated, msg: "no caller identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := tt.srv
			if srv == "" {
				srv = "writeback"
			}
			rec := recs[srv]
			before, _ := rec.snapshot()
			cc, ctx := tt.conn, testContext(t)
			if cc == nil {
				cc = plain(srv)
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

	// A client whose credentials cannot name an audience for the call fails it before it
	// leaves, naming the service, rather than send a token to an unknown party.
	t.Run("unknown service", func(t *testing.T) {
		err := as("writeback", "coordinator").Invoke(testContext(t), "/other.v1.Thing/Do", &handoffv1.GetJobRequest{}, &handoffv1.GetJobResponse{})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "other.v1.Thing is not a handoff service") {
			t.Fatalf("err %v, want Unauthenticated naming other.v1.Thing", err)
		}
	})
	// Health through a connection with credentials carries no token and works.
	t.Run("health without a token", func(t *testing.T) {
		resp, err := healthpb.NewHealthClient(as("writeback", "coordinator")).Check(testContext(t), &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health: %v %v", resp, err)
		}
	})
}

// The client's audience table names the services gen/handoff/v1 declares.
func TestAudiencesMatchTheProto(t *testing.T) {
	r := newRing(t)
	for svc, desc := range map[string]grpc.ServiceDesc{
		"writeback": handoffv1.WritebackService_ServiceDesc, "agentrunner": handoffv1.AgentRunnerService_ServiceDesc, "coordinator": handoffv1.CoordinatorService_ServiceDesc,
	} {
		method := "/" + desc.ServiceName + "/X"
		md, err := r["coordinator"].PerRPCCredentials().GetRequestMetadata(credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{Method: method}))
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if _, err := r.verifier(t, svc).Verify(strings.TrimPrefix(md["authorization"], "Bearer "), time.Now()); err != nil {
			t.Errorf("%s: token not for %s: %v", method, svc, err)
		}
	}
}

func TestHealthAndReflectionOpenWithoutIdentity(t *testing.T) {
	// A policy that names nobody: health and reflection stay open all the same.
	addr, _ := serve(t, insecure.NewCredentials(), identity.WithPolicy(identity.Policy{}))
	cc := testkit.Dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	//lint:ignore SA1019 v1alpha is deprecated but still served: older grpcurl builds ask for it.
	if err := v1a.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 as above.
	if r, err := v1a.Recv(); err != nil || len(r.GetListServicesResponse().GetService()) == 0 {
		t.Fatalf("reflection v1alpha: %v %v", r, err)
	}

	// And the services themselves are closed.
	if err := writeCall(ctx, cc); status.Code(err) != codes.Unauthenticated {
		t.Errorf("write without identity: %v", err)
	}
}
