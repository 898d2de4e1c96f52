package identity_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

func newSigner(t *testing.T, fill byte) *identity.Signer {
	t.Helper()
	s, err := identity.NewSigner(bytes.Repeat([]byte{fill}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSigner(t *testing.T) {
	if _, err := identity.NewSigner(make([]byte, 31)); err == nil || !strings.Contains(err.Error(), "31 bytes, need at least 32") {
		t.Errorf("short key: err %v", err)
	}
	if _, err := identity.NewSigner(nil); err == nil {
		t.Error("nil key accepted")
	}
	key := bytes.Repeat([]byte{7}, 32)
	s, err := identity.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	tok := s.Token("coordinator", time.Minute)
	key[0] = 8 // the signer keeps its own copy
	if _, err := s.Verify(tok, time.Now()); err != nil {
		t.Errorf("key changed under the signer: %v", err)
	}
	r1, err := identity.NewRandomSigner()
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := identity.NewRandomSigner()
	if _, err := r2.Verify(r1.Token("coordinator", time.Minute), time.Now()); !errors.Is(err, identity.ErrBadSignature) {
		t.Errorf("two random signers share a key: %v", err)
	}
}

func TestTokenFormat(t *testing.T) {
	s := newSigner(t, 1)
	tok := s.Token("writeback", time.Hour)
	parts := strings.Split(tok, ".")
	if len(parts) != 4 || parts[0] != "hst1" || parts[1] != "writeback" || len(parts[3]) != 43 {
		t.Fatalf("token %q: want hst1.writeback.<expiry>.<43 base64url chars>", tok)
	}
	if strings.ContainsAny(parts[3], "+/=") {
		t.Errorf("signature %q is not unpadded base64url", parts[3])
	}
}

func TestVerify(t *testing.T) {
	s, other := newSigner(t, 1), newSigner(t, 2)
	now := time.Now()
	valid := s.Token("coordinator", time.Minute)
	parts := strings.Split(valid, ".")
	sig := parts[3]
	flip := func(b byte) byte {
		if b == 'A' {
			return 'B'
		}
		return 'A'
	}

	tests := []struct {
		name    string
		tok     string
		now     time.Time
		service string
		err     error
		msg     string
	}{
		{name: "valid", tok: valid, now: now, service: "coordinator"},
		{name: "valid up to the last second", tok: valid, now: now.Add(50 * time.Second), service: "coordinator"},
		{name: "expired", tok: s.Token("coordinator", -time.Minute), now: now, err: identity.ErrTokenExpired, msg: `"coordinator"'s token expired 1m`},
		{name: "expired at verify time", tok: valid, now: now.Add(2 * time.Minute), err: identity.ErrTokenExpired},
		{name: "wrong key", tok: other.Token("coordinator", time.Minute), now: now, err: identity.ErrBadSignature, msg: "wrong key or altered token"},
		{name: "tampered service", tok: strings.Replace(s.Token("agentrunner", time.Minute), ".agentrunner.", ".coordinator.", 1), now: now, err: identity.ErrBadSignature, msg: `token for "coordinator"`},
		{name: "tampered expiry", tok: "hst1.coordinator.99999999999." + sig, now: now, err: identity.ErrBadSignature},
		{name: "tampered signature", tok: strings.Join(parts[:3], ".") + "." + string(flip(sig[0])) + sig[1:], now: now, err: identity.ErrBadSignature},
		{name: "empty", tok: "", now: now, err: identity.ErrMalformedToken, msg: "want hst1.<service>.<unix-expiry>.<signature>"},
		{name: "too few parts", tok: "hst1.coordinator", now: now, err: identity.ErrMalformedToken},
		{name: "too many parts", tok: valid + ".x", now: now, err: identity.ErrMalformedToken},
		{name: "other version", tok: "hst2." + strings.Join(parts[1:], "."), now: now, err: identity.ErrMalformedToken, msg: `version "hst2"`},
		{name: "bad service name", tok: "hst1.Coordinator." + parts[2] + "." + sig, now: now, err: identity.ErrMalformedToken, msg: "not a service name"},
		{name: "empty service", tok: "hst1.." + parts[2] + "." + sig, now: now, err: identity.ErrMalformedToken},
		{name: "expiry not a number", tok: "hst1.coordinator.soon." + sig, now: now, err: identity.ErrMalformedToken, msg: "not a unix time"},
		{name: "expiry with sign", tok: "hst1.coordinator.+" + parts[2] + "." + sig, now: now, err: identity.ErrMalformedToken},
		{name: "expiry with leading zero", tok: "hst1.coordinator.0" + parts[2] + "." + sig, now: now, err: identity.ErrMalformedToken},
		{name: "signature padded", tok: valid + "=", now: now, err: identity.ErrMalformedToken, msg: "base64url"},
		{name: "signature std base64", tok: strings.Join(parts[:3], ".") + ".+/" + sig[2:], now: now, err: identity.ErrMalformedToken},
		{name: "signature short", tok: strings.Join(parts[:3], ".") + "." + sig[:20], now: now, err: identity.ErrMalformedToken},
		{name: "too long", tok: "hst1." + strings.Repeat("a", 300) + ".1.x", now: now, err: identity.ErrMalformedToken, msg: "longer than 256 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc, err := s.Verify(tt.tok, tt.now)
			if tt.err == nil {
				if err != nil || svc != tt.service {
					t.Fatalf("Verify = %q, %v; want %q", svc, err, tt.service)
				}
				return
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if svc != "" {
				t.Errorf("service %q returned with an error", svc)
			}
			if tt.msg != "" && !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err %q, want it to contain %q", err, tt.msg)
			}
		})
	}
}

func TestPerRPCCredentials(t *testing.T) {
	s := newSigner(t, 1)
	creds := s.PerRPCCredentials("coordinator")
	if creds.RequireTransportSecurity() {
		t.Error("RequireTransportSecurity: want false (loopback plaintext)")
	}
	md, err := creds.GetRequestMetadata(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := strings.CutPrefix(md["authorization"], "Bearer ")
	if !ok {
		t.Fatalf("metadata %v: want authorization: Bearer ...", md)
	}
	if svc, err := s.Verify(tok, time.Now()); err != nil || svc != "coordinator" {
		t.Errorf("Verify = %q, %v", svc, err)
	}
	if _, err := s.Verify(tok, time.Now().Add(10*time.Minute)); !errors.Is(err, identity.ErrTokenExpired) {
		t.Errorf("client token still valid in 10 minutes: %v", err)
	}
	if _, err := s.PerRPCCredentials("not a name").GetRequestMetadata(context.Background()); err == nil {
		t.Error("minted a token for an invalid service name")
	}
}
