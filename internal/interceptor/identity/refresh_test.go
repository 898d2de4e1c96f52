package identity

import (
	"context"
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

func callTo(method string) context.Context {
	return credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{Method: method})
}

// The client credentials keep one token per audience, reuse it while it has more than
// clientRefresh left, then mint a new one, so no call leaves with a token about to expire.
func TestPerRPCCredentialsRefresh(t *testing.T) {
	s, err := NewSigner("coordinator", ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier("writeback", map[string]ed25519.PublicKey{"coordinator": s.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return now }
	creds := s.PerRPCCredentials()
	get := func(method string) string {
		md, err := creds.GetRequestMetadata(callTo(method))
		if err != nil {
			t.Fatal(err)
		}
		tok, ok := strings.CutPrefix(md["authorization"], "Bearer ")
		if !ok {
			t.Fatalf("metadata %v: want authorization: Bearer ...", md)
		}
		return tok
	}
	const write, deliver = "/handoff.v1.WritebackService/Write", "/handoff.v1.AgentRunnerService/Deliver"

	first := get(write)
	if other := get(deliver); other == first || !strings.Contains(other, ".coordinator.agentrunner.") {
		t.Errorf("a Deliver call got %q: want its own token for agentrunner", other)
	}
	now = now.Add(clientTTL - clientRefresh - time.Second)
	if got := get(write); got != first {
		t.Errorf("token replaced with %s left", clientRefresh+time.Second)
	}
	now = now.Add(2 * time.Second)
	second := get(write)
	if second == first {
		t.Fatalf("token not replaced with less than %s left", clientRefresh)
	}
	if svc, err := v.Verify(second, now.Add(clientTTL-time.Second)); err != nil || svc != "coordinator" {
		t.Errorf("new token: %q, %v", svc, err)
	}
	if _, err := v.Verify(first, now.Add(clientRefresh+ClockSkew)); err == nil {
		t.Error("old token outlived its expiry")
	}
}

// A token minted by the client credentials passes the verifier's lifetime rule with room
// to spare: the two constants must not drift apart.
func TestClientTTLWithinMaxLifetime(t *testing.T) {
	if clientTTL > MaxLifetime || clientRefresh >= clientTTL {
		t.Fatalf("clientTTL %s, clientRefresh %s, MaxLifetime %s", clientTTL, clientRefresh, MaxLifetime)
	}
}
