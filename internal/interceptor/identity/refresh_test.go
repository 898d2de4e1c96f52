package identity

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// The client credentials reuse a token while it has more than clientRefresh left, then
// mint a new one, so no call leaves with a token about to expire.
func TestPerRPCCredentialsRefresh(t *testing.T) {
	s, err := NewSigner(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return now }
	creds := s.PerRPCCredentials("coordinator")
	get := func() string {
		md, err := creds.GetRequestMetadata(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return md["authorization"]
	}

	first := get()
	now = now.Add(clientTTL - clientRefresh - time.Second)
	if got := get(); got != first {
		t.Errorf("token replaced with %s left", clientRefresh+time.Second)
	}
	now = now.Add(2 * time.Second)
	second := get()
	if second == first {
		t.Fatalf("token not replaced with less than %s left", clientRefresh)
	}
	if svc, err := s.Verify(second[len("Bearer "):], now.Add(clientTTL-time.Second)); err != nil || svc != "coordinator" {
		t.Errorf("new token: %q, %v", svc, err)
	}
	if _, err := s.Verify(first[len("Bearer "):], now.Add(clientRefresh)); err == nil {
		t.Error("old token outlived its expiry")
	}
}
