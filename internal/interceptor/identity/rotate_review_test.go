package identity

import (
	"context"
	"crypto/ed25519"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

type headerWriteback struct {
	handoffv1.UnimplementedWritebackServiceServer
	mu  sync.Mutex
	got []string
}

func (s *headerWriteback) Write(ctx context.Context, _ *handoffv1.WriteRequest) (*handoffv1.WriteResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.got = append(s.got, strings.Join(md.Get("authorization"), ","))
	s.mu.Unlock()
	return &handoffv1.WriteResponse{}, nil
}

// TestPerRPCTokenRotates: over gRPC, the cached "Bearer <token>" a client sends is replaced
// before its token nears expiry: at every moment of 20 minutes of calls (30 s apart on the
// signer's clock) the header received is one token, valid at that moment with at least
// clientRefresh left, and the header changes as the tokens do.
func TestPerRPCTokenRotates(t *testing.T) {
	s, err := GenerateSigner("coordinator")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	v, err := NewVerifier("writeback", map[string]ed25519.PublicKey{"coordinator": s.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	srv := &headerWriteback{}
	g := grpc.NewServer()
	handoffv1.RegisterWritebackServiceServer(g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(s.PerRPCCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c := handoffv1.NewWritebackServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	distinct := map[string]bool{}
	for i := 0; i <= 40; i++ {
		mu.Lock()
		at := now
		mu.Unlock()
		if _, err := c.Write(ctx, &handoffv1.WriteRequest{}); err != nil {
			t.Fatal(err)
		}
		srv.mu.Lock()
		h := srv.got[len(srv.got)-1]
		srv.mu.Unlock()
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || strings.Contains(tok, ",") {
			t.Fatalf("call %d: authorization %q, want one Bearer token", i, h)
		}
		if _, err := v.Verify(tok, at); err != nil {
			t.Fatalf("call %d at +%s: the token sent does not verify then: %v", i, at.Sub(time.Unix(1_800_000_000, 0)), err)
		}
		if left := time.Unix(claimsExp(t, tok), 0).Sub(at); left < clientRefresh {
			t.Fatalf("call %d: the token sent has %s left, want at least %s", i, left, clientRefresh)
		}
		distinct[h] = true
		mu.Lock()
		now = now.Add(30 * time.Second)
		mu.Unlock()
	}
	// 20 minutes of 5-minute tokens replaced with 2 minutes left: one every 3 minutes.
	if len(distinct) < 6 {
		t.Fatalf("%d distinct tokens over 20 minutes; want one every %s", len(distinct), clientTTL-clientRefresh)
	}
}

// claimsExp is the expiry of tok.
func claimsExp(t *testing.T, tok string) int64 {
	t.Helper()
	c, err := parseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	return c.exp
}
