package identity_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

// seededKey is a fixed Ed25519 key, so a test can hold "writeback's key" and sign with it
// under another name.
func seededKey(fill byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{fill}, ed25519.SeedSize))
}

// ring is one signer per service, each with its own key, as `handoff keys` makes them.
type ring map[string]*identity.Signer

var ringServices = []string{"coordinator", "agentrunner", "writeback", "operator"}

func newRing(t *testing.T, extra ...string) ring {
	t.Helper()
	r := ring{}
	for i, svc := range append(append([]string(nil), ringServices...), extra...) {
		s, err := identity.NewSigner(svc, seededKey(byte(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		r[svc] = s
	}
	return r
}

// public is what every verifier holds: the public keys, no private one.
func (r ring) public() map[string]ed25519.PublicKey {
	out := map[string]ed25519.PublicKey{}
	for svc, s := range r {
		out[svc] = s.PublicKey()
	}
	return out
}

func (r ring) verifier(t *testing.T, audience string) *identity.Verifier {
	t.Helper()
	v, err := identity.NewVerifier(audience, r.public())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// token mints a valid token from s to audience.
func token(t *testing.T, s *identity.Signer, audience string) string {
	t.Helper()
	tok, err := s.Token(audience, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestNewSigner(t *testing.T) {
	for _, tt := range []struct {
		name, svc string
		key       ed25519.PrivateKey
		msg       string
	}{
		{"bad service", "Coordinator", seededKey(1), `"Coordinator" is not a service name`},
		{"empty service", "", seededKey(1), "not a service name"},
		{"short key", "coordinator", seededKey(1)[:31], "31 bytes, want an Ed25519 private key (64)"},
		{"no key", "coordinator", nil, "0 bytes"},
	} {
		if _, err := identity.NewSigner(tt.svc, tt.key); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.msg)
		}
	}
	key := seededKey(7)
	s, err := identity.NewSigner("coordinator", key)
	if err != nil {
		t.Fatal(err)
	}
	pub := s.PublicKey()
	clear(key) // the signer keeps its own copy
	v, _ := identity.NewVerifier("writeback", map[string]ed25519.PublicKey{"coordinator": pub})
	if _, err := v.Verify(token(t, s, "writeback"), time.Now()); err != nil {
		t.Errorf("key changed under the signer: %v", err)
	}
	if s.Service() != "coordinator" {
		t.Errorf("Service = %q", s.Service())
	}

	g1, err := identity.GenerateSigner("coordinator")
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := identity.GenerateSigner("coordinator")
	v2, _ := identity.NewVerifier("writeback", map[string]ed25519.PublicKey{"coordinator": g2.PublicKey()})
	if _, err := v2.Verify(token(t, g1, "writeback"), time.Now()); !errors.Is(err, identity.ErrBadSignature) {
		t.Errorf("two generated signers share a key: %v", err)
	}
	if _, err := identity.GenerateSigner("Not A Name"); err == nil {
		t.Error("GenerateSigner accepted a bad service name")
	}
}

func TestToken(t *testing.T) {
	s := newRing(t)["coordinator"]
	before := time.Now().Unix()
	tok := token(t, s, "writeback")
	parts := strings.Split(tok, ".")
	if len(parts) != 6 || parts[0] != "hst2" || parts[1] != "coordinator" || parts[2] != "writeback" || len(parts[5]) != 86 {
		t.Fatalf("token %q: want hst2.coordinator.writeback.<iat>.<exp>.<86 base64url chars>", tok)
	}
	iat, _ := strconv.ParseInt(parts[3], 10, 64)
	exp, _ := strconv.ParseInt(parts[4], 10, 64)
	if iat < before || iat > time.Now().Unix() || exp != iat+60 {
		t.Errorf("issued %d, expires %d: want now and a minute later", iat, exp)
	}
	if strings.ContainsAny(parts[5], "+/=") {
		t.Errorf("signature %q is not unpadded base64url", parts[5])
	}
	if _, err := s.Token("writeback", identity.MaxLifetime); err != nil {
		t.Errorf("Token at MaxLifetime: %v", err)
	}
	for _, tt := range []struct {
		name string
		aud  string
		ttl  time.Duration
		msg  string
	}{
		{"bad audience", "Writeback", time.Minute, `audience "Writeback" is not a service name`},
		{"zero ttl", "writeback", 0, "want more than 0 and at most 10m0s"},
		{"negative ttl", "writeback", -time.Minute, "want more than 0"},
		{"over the max", "writeback", identity.MaxLifetime + time.Second, "at most 10m0s"},
		{"2286", "writeback", time.Until(time.Date(2286, 11, 20, 0, 0, 0, 0, time.UTC)), "at most 10m0s"},
	} {
		if tok, err := s.Token(tt.aud, tt.ttl); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: Token = %q, %v; want an error with %q", tt.name, tok, err, tt.msg)
		}
	}
}

func TestNewVerifier(t *testing.T) {
	pub := seededKey(1).Public().(ed25519.PublicKey)
	for _, tt := range []struct {
		name, aud string
		keys      map[string]ed25519.PublicKey
		msg       string
	}{
		{"bad audience", "Writeback", map[string]ed25519.PublicKey{"coordinator": pub}, `audience "Writeback" is not a service name`},
		{"no keys", "writeback", nil, "no public keys"},
		{"bad key name", "writeback", map[string]ed25519.PublicKey{"coordinator.pub": pub}, `"coordinator.pub" is not a service name`},
		{"short key", "writeback", map[string]ed25519.PublicKey{"coordinator": pub[:16]}, "16 bytes, want an Ed25519 public key (32)"},
	} {
		if _, err := identity.NewVerifier(tt.aud, tt.keys); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.msg)
		}
	}
	keys := map[string]ed25519.PublicKey{"coordinator": newRing(t)["coordinator"].PublicKey()}
	v, err := identity.NewVerifier("writeback", keys)
	if err != nil {
		t.Fatal(err)
	}
	keys["coordinator"] = newRing(t)["agentrunner"].PublicKey() // the verifier keeps its own copy
	if _, err := v.Verify(token(t, newRing(t)["coordinator"], "writeback"), time.Now()); err != nil || v.Audience() != "writeback" {
		t.Errorf("keys changed under the verifier: %v (audience %q)", err, v.Audience())
	}
}

func TestVerify(t *testing.T) {
	r := newRing(t)
	coord := r["coordinator"]
	v := r.verifier(t, "writeback")
	now := time.Now()
	at := now.Unix()
	valid := coord.Mint("writeback", at, at+60)
	parts := strings.Split(valid, ".")
	sig := parts[5]
	payload := strings.Join(parts[:5], ".")
	flip := func(b byte) byte {
		if b == 'A' {
			return 'B'
		}
		return 'A'
	}
	// forged claims: writeback's and agentrunner's keys signing as the coordinator.
	asCoord := func(key ed25519.PrivateKey) *identity.Signer {
		s, err := identity.NewSigner("coordinator", key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	wbKey, arKey := seededKey(3), seededKey(2) // newRing's keys of writeback and agentrunner
	if !r["writeback"].PublicKey().Equal(wbKey.Public()) || !r["agentrunner"].PublicKey().Equal(arKey.Public()) {
		t.Fatal("seededKey does not match newRing's keys")
	}
	intruder, err := identity.NewSigner("intruder", seededKey(42))
	if err != nil {
		t.Fatal(err)
	}
	y2286 := time.Date(2286, 11, 20, 17, 46, 39, 0, time.UTC).Unix()
	skew := int64(identity.ClockSkew / time.Second)
	max := int64(identity.MaxLifetime / time.Second)

	tests := []struct {
		name   string
		tok    string
		now    time.Time
		issuer string
		err    error
		msg    string
	}{
		{name: "valid", tok: valid, now: now, issuer: "coordinator"},
		{name: "valid from another caller", tok: r["operator"].Mint("writeback", at, at+60), now: now, issuer: "operator"},
		{name: "valid just before expiry plus skew", tok: valid, now: time.Unix(at+60+skew-1, 0), issuer: "coordinator"},
		{name: "valid at the max lifetime", tok: coord.Mint("writeback", at, at+max), now: now, issuer: "coordinator"},
		{name: "valid issued within the skew ahead", tok: coord.Mint("writeback", at+skew, at+skew+60), now: time.Unix(at, 0), issuer: "coordinator"},

		// Who signed it.
		{name: "writeback's key claiming coordinator", tok: asCoord(wbKey).Mint("writeback", at, at+60), now: now, err: identity.ErrBadSignature, msg: `token from "coordinator"`},
		{name: "agentrunner's key claiming coordinator", tok: asCoord(arKey).Mint("writeback", at, at+60), now: now, err: identity.ErrBadSignature},
		{name: "unknown issuer", tok: intruder.Mint("writeback", at, at+60), now: now, err: identity.ErrUnknownIssuer,
			msg: `"intruder"`},
		{name: "tampered issuer", tok: strings.Replace(r["agentrunner"].Mint("writeback", at, at+60), ".agentrunner.", ".coordinator.", 1), now: now, err: identity.ErrBadSignature},
		{name: "tampered audience", tok: strings.Replace(coord.Mint("agentrunner", at, at+60), ".agentrunner.", ".writeback.", 1), now: now, err: identity.ErrBadSignature},
		{name: "tampered expiry", tok: strings.Join([]string{"hst2", "coordinator", "writeback", parts[3], strconv.FormatInt(at+max, 10), sig}, "."), now: now, err: identity.ErrBadSignature},
		{name: "tampered signature", tok: payload + "." + string(flip(sig[0])) + sig[1:], now: now, err: identity.ErrBadSignature},
		// The signature is checked before any claim: a forged token that also breaks a
		// rule says it is forged, not which rule it broke.
		{name: "forged and wrong audience", tok: asCoord(wbKey).Mint("agentrunner", at, at+60), now: now, err: identity.ErrBadSignature},
		{name: "forged and 2286", tok: asCoord(wbKey).Mint("writeback", at, y2286), now: now, err: identity.ErrBadSignature},

		// What it claims.
		{name: "audience agentrunner", tok: coord.Mint("agentrunner", at, at+60), now: now, err: identity.ErrWrongAudience,
			msg: `"coordinator"'s token is for "agentrunner", this is "writeback"`},
		{name: "expiry in 2286", tok: coord.Mint("writeback", at, y2286), now: now, err: identity.ErrTokenLifetime, msg: "2286-11-20T17:46:39Z; it must end after it starts and last at most 10m0s"},
		{name: "one second over the max", tok: coord.Mint("writeback", at, at+max+1), now: now, err: identity.ErrTokenLifetime},
		{name: "expiry at issue", tok: coord.Mint("writeback", at, at), now: now, err: identity.ErrTokenLifetime},
		{name: "expiry before issue", tok: coord.Mint("writeback", at, at-1), now: now, err: identity.ErrTokenLifetime},
		{name: "issued in the future", tok: coord.Mint("writeback", at+300, at+360), now: time.Unix(at, 0), err: identity.ErrTokenNotYetValid,
			msg: "5m0s ahead of this server's clock (allowed skew 30s)"},
		{name: "issued just past the skew", tok: coord.Mint("writeback", at+skew+1, at+skew+60), now: time.Unix(at, 0), err: identity.ErrTokenNotYetValid},
		{name: "expired", tok: coord.Mint("writeback", at-120, at-60), now: time.Unix(at, 0), err: identity.ErrTokenExpired, msg: `"coordinator"'s token expired 1m0s ago`},
		{name: "expired past the skew", tok: valid, now: time.Unix(at+60+skew, 0), err: identity.ErrTokenExpired},

		// Form.
		{name: "empty", tok: "", now: now, err: identity.ErrMalformedToken, msg: `version "", want hst2`},
		{name: "hst1 shared-key token", tok: "hst1.coordinator.99999999999.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", now: now, err: identity.ErrMalformedToken,
			msg: "version hst1 (shared-key tokens) is no longer accepted"},
		{name: "other version", tok: "hst3." + strings.Join(parts[1:], "."), now: now, err: identity.ErrMalformedToken, msg: `version "hst3"`},
		{name: "too few parts", tok: "hst2.coordinator.writeback", now: now, err: identity.ErrMalformedToken, msg: "want hst2.<issuer>.<audience>.<issued-at>.<expiry>.<signature>"},
		{name: "too many parts", tok: valid + ".x", now: now, err: identity.ErrMalformedToken},
		{name: "bad issuer name", tok: "hst2.Coordinator." + strings.Join(parts[2:], "."), now: now, err: identity.ErrMalformedToken, msg: `issuer "Coordinator" is not a service name`},
		{name: "empty audience", tok: "hst2.coordinator.." + strings.Join(parts[3:], "."), now: now, err: identity.ErrMalformedToken, msg: `audience ""`},
		{name: "issued-at not a number", tok: "hst2.coordinator.writeback.now." + strings.Join(parts[4:], "."), now: now, err: identity.ErrMalformedToken, msg: "issued-at \"now\" is not a unix time"},
		{name: "expiry not a number", tok: payload[:len(payload)-len(parts[4])] + "soon." + sig, now: now, err: identity.ErrMalformedToken, msg: "expiry \"soon\""},
		{name: "expiry with sign", tok: payload[:len(payload)-len(parts[4])] + "+" + parts[4] + "." + sig, now: now, err: identity.ErrMalformedToken},
		{name: "expiry with leading zero", tok: payload[:len(payload)-len(parts[4])] + "0" + parts[4] + "." + sig, now: now, err: identity.ErrMalformedToken},
		{name: "expiry past int64", tok: payload[:len(payload)-len(parts[4])] + "9999999999999999999." + sig, now: now, err: identity.ErrMalformedToken},
		{name: "signature padded", tok: valid + "==", now: now, err: identity.ErrMalformedToken, msg: "base64url"},
		{name: "signature std base64", tok: payload + ".+/" + sig[2:], now: now, err: identity.ErrMalformedToken},
		{name: "signature short", tok: payload + "." + sig[:43], now: now, err: identity.ErrMalformedToken},
		{name: "too long", tok: "hst2." + strings.Repeat("a", 400) + ".1.1.x", now: now, err: identity.ErrMalformedToken, msg: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issuer, err := v.Verify(tt.tok, tt.now)
			if tt.err == nil {
				if err != nil || issuer != tt.issuer {
					t.Fatalf("Verify = %q, %v; want %q", issuer, err, tt.issuer)
				}
				return
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if issuer != "" {
				t.Errorf("issuer %q returned with an error", issuer)
			}
			if tt.msg != "" && !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err %q, want it to contain %q", err, tt.msg)
			}
		})
	}
}

func TestPerRPCCredentials(t *testing.T) {
	r := newRing(t)
	creds := r["coordinator"].PerRPCCredentials()
	if creds.RequireTransportSecurity() {
		t.Error("RequireTransportSecurity: want false (loopback plaintext)")
	}
	call := func(method string) (map[string]string, error) {
		return creds.GetRequestMetadata(credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{Method: method}))
	}
	for method, aud := range map[string]string{
		"/handoff.v1.WritebackService/Write":       "writeback",
		"/handoff.v1.AgentRunnerService/Deliver":   "agentrunner",
		"/handoff.v1.CoordinatorService/SubmitJob": "coordinator",
	} {
		md, err := call(method)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		tok, ok := strings.CutPrefix(md["authorization"], "Bearer ")
		if !ok {
			t.Fatalf("%s: metadata %v: want authorization: Bearer ...", method, md)
		}
		v := r.verifier(t, aud)
		if svc, err := v.Verify(tok, time.Now()); err != nil || svc != "coordinator" {
			t.Errorf("%s: Verify as %s = %q, %v", method, aud, svc, err)
		}
		if _, err := v.Verify(tok, time.Now().Add(6*time.Minute)); !errors.Is(err, identity.ErrTokenExpired) {
			t.Errorf("%s: client token still valid in 6 minutes: %v", method, err)
		}
	}
	// Health and reflection are always open: no token goes to them.
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"} {
		if md, err := call(m); err != nil || len(md) != 0 {
			t.Errorf("%s: metadata %v, %v; want none", m, md, err)
		}
	}
	// Any other service has no audience: refused, naming it.
	if _, err := call("/other.v1.Thing/Do"); err == nil || !strings.Contains(err.Error(), "other.v1.Thing is not a handoff service") {
		t.Errorf("unknown service: %v", err)
	}
	if _, err := call("nonsense"); err == nil {
		t.Error("minted a token for a malformed method")
	}
	if _, err := creds.GetRequestMetadata(context.Background()); err == nil || !strings.Contains(err.Error(), "no token audience") {
		t.Errorf("no method in context: %v", err)
	}
}

// A token already verified is not checked for its signature again, but its claims are,
// against the clock of each call: it still expires, and a look-alike with another
// signature is not taken for it.
func TestVerifiedTokensStillExpire(t *testing.T) {
	r := newRing(t)
	v := r.verifier(t, "writeback")
	now := time.Now()
	tok := token(t, r["coordinator"], "writeback")
	for range 2 {
		if iss, err := v.Verify(tok, now); err != nil || iss != "coordinator" {
			t.Fatalf("Verify = %q, %v", iss, err)
		}
	}
	if _, err := v.Verify(tok, now.Add(time.Minute+identity.ClockSkew+time.Second)); !errors.Is(err, identity.ErrTokenExpired) {
		t.Fatalf("the verified token after its expiry: %v, want ErrTokenExpired", err)
	}
	last := tok[len(tok)-1]
	forged := tok[:len(tok)-1] + string(map[bool]byte{true: 'A', false: 'B'}[last != 'A'])
	if _, err := v.Verify(forged, now); err == nil {
		t.Fatal("a token with an altered signature was accepted after the genuine one was cached")
	}
}
