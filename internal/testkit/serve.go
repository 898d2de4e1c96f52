package testkit

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// Servable is a gRPC server a test runs: a *grpc.Server, or a *server.Server from
// internal/server.
type Servable interface {
	Serve(net.Listener) error
	Stop()
}

// Serve serves s on an in-memory listener until the test ends and returns a plaintext
// client connection to it; opts are added to the dial options (per-RPC credentials, a
// stats handler). The connection closes, then the server stops, at the test's end.
func Serve(t testing.TB, s Servable, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// ServeTCP serves s on a free port of 127.0.0.1 until the test ends and returns its
// address: for tests of what only a real connection shows (HTTP/2 settings, keepalive).
func ServeTCP(t testing.TB, s Servable) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// Dial returns a client connection to addr (plaintext unless opts set credentials),
// closed when the test ends.
func Dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
