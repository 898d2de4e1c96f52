package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// A service token is
//
//	hst2.<issuer>.<audience>.<issued-at>.<expiry>.<signature>
//
// where the times are unix seconds and the signature is the issuer's Ed25519 signature of
// everything before its dot, in unpadded base64url. It says "<issuer> calls <audience>
// between issued-at and expiry". Each service signs with its own private key and verifiers
// hold only public keys, so a service that checks tokens cannot mint one for another
// identity; the audience stops a token taken from one call being replayed on another
// service; the lifetime cap (MaxLifetime) bounds how long a leaked token is worth anything.
//
// A token binds no method or channel, so it is still only as private as the connection it
// travels on: plaintext on loopback. Between hosts, use mTLS.
const tokenVersion = "hst2"

// hst1 was the shared-key HMAC token, which any holder of the key could mint for any
// service. It is refused by name so an old deployment learns why.
const oldTokenVersion = "hst1"

const (
	// MaxLifetime is the longest a token may be valid (expiry minus issued-at). Verify
	// refuses longer ones whatever they say; Token refuses to mint them.
	MaxLifetime = 10 * time.Minute
	// ClockSkew is how far the verifier's clock may be behind or ahead of the issuer's: a
	// token issued up to ClockSkew in the future, or expired up to ClockSkew ago, passes.
	ClockSkew = 30 * time.Second
)

const (
	// version, two DNS labels, two 19-digit times, 86 signature characters, 5 dots.
	maxTokenLen = 4 + 63 + 63 + 19 + 19 + 86 + 5
	// Tokens minted by PerRPCCredentials live clientTTL and are replaced once less than
	// clientRefresh is left, so a call never leaves with a token about to expire.
	clientTTL     = 5 * time.Minute
	clientRefresh = 2 * time.Minute
)

// Errors Verify wraps; test them with errors.Is.
var (
	ErrMalformedToken   = errors.New("malformed service token")
	ErrUnknownIssuer    = errors.New("service token from an unknown issuer")
	ErrBadSignature     = errors.New("service token signature does not verify (not signed by the issuer's key, or altered)")
	ErrWrongAudience    = errors.New("service token is for another service")
	ErrTokenLifetime    = errors.New("service token lifetime is not allowed")
	ErrTokenNotYetValid = errors.New("service token is issued in the future")
	ErrTokenExpired     = errors.New("service token expired")
)

var serviceName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validService reports whether svc is a service name: a DNS label, as internal/certs makes.
func validService(svc string) bool { return serviceName.MatchString(svc) }

// Signer mints the tokens of one service with that service's private key. Safe for
// concurrent use.
type Signer struct {
	service string
	key     ed25519.PrivateKey
	now     func() time.Time // the clock of Token and PerRPCCredentials; tests replace it
}

// NewSigner returns a Signer that mints tokens naming service as their issuer, signed with
// key (copied). Verifiers accept them only where they hold key's public half under that
// name.
func NewSigner(service string, key ed25519.PrivateKey) (*Signer, error) {
	if !validService(service) {
		return nil, fmt.Errorf("identity: signer service %q is not a service name (a DNS label)", service)
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("identity: signer key for %q is %d bytes, want an Ed25519 private key (%d)", service, len(key), ed25519.PrivateKeySize)
	}
	return &Signer{service: service, key: slices.Clone(key), now: time.Now}, nil
}

// GenerateSigner returns a Signer for service with a fresh random key: how `handoff up`
// gives each of its services its own key for the life of the process.
func GenerateSigner(service string) (*Signer, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generate key for %q: %w", service, err)
	}
	return NewSigner(service, key)
}

// Service is the issuer the signer's tokens name.
func (s *Signer) Service() string { return s.service }

// PublicKey is the key a verifier needs to accept the signer's tokens.
func (s *Signer) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Token returns a token from the signer's service to audience, issued now and valid for
// ttl, which must be positive and at most MaxLifetime. Times are whole seconds, so ttl is
// rounded to them; a ttl that rounds to nothing is an error.
func (s *Signer) Token(audience string, ttl time.Duration) (string, error) {
	if !validService(audience) {
		return "", fmt.Errorf("identity: token audience %q is not a service name", audience)
	}
	if ttl <= 0 || ttl > MaxLifetime {
		return "", fmt.Errorf("identity: token ttl %s: want more than 0 and at most %s", ttl, MaxLifetime)
	}
	now := s.now()
	iat, exp := now.Unix(), now.Add(ttl).Unix()
	if exp <= iat {
		return "", fmt.Errorf("identity: token ttl %s is under a second from now", ttl)
	}
	return s.mint(audience, iat, exp), nil
}

// mint signs a token with any claims at all: the verifier, not the signer, is what holds
// the rules, and tests need tokens that break them.
func (s *Signer) mint(audience string, iat, exp int64) string {
	payload := strings.Join([]string{tokenVersion, s.service, audience, strconv.FormatInt(iat, 10), strconv.FormatInt(exp, 10)}, ".")
	return payload + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(s.key, []byte(payload)))
}

// Verifier checks the tokens sent to one service, with the public keys of the services it
// accepts as callers. It cannot mint a token. Safe for concurrent use.
type Verifier struct {
	audience string
	keys     map[string]ed25519.PublicKey

	// verified remembers tokens whose signature held, by their exact text: a client sends
	// the same token for minutes, and an Ed25519 check costs tens of microseconds a call.
	// A hit still has its claims checked against the clock.
	mu       sync.Mutex
	verified map[string]claims
}

// maxVerified bounds the verified-token cache; past it, expired entries are dropped, and
// all of them when none has expired.
const maxVerified = 4096

// NewVerifier returns a Verifier for tokens addressed to audience (the service that runs
// it), accepting those signed with keys[issuer] (copied). Which issuer may call which
// method is the policy's business, not the verifier's.
func NewVerifier(audience string, keys map[string]ed25519.PublicKey) (*Verifier, error) {
	if !validService(audience) {
		return nil, fmt.Errorf("identity: verifier audience %q is not a service name", audience)
	}
	if len(keys) == 0 {
		return nil, errors.New("identity: verifier has no public keys: it would accept no token")
	}
	own := make(map[string]ed25519.PublicKey, len(keys))
	for _, svc := range slices.Sorted(maps.Keys(keys)) {
		if !validService(svc) {
			return nil, fmt.Errorf("identity: public key name %q is not a service name", svc)
		}
		if len(keys[svc]) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("identity: public key of %q is %d bytes, want an Ed25519 public key (%d)", svc, len(keys[svc]), ed25519.PublicKeySize)
		}
		own[svc] = slices.Clone(keys[svc])
	}
	return &Verifier{audience: audience, keys: own, verified: map[string]claims{}}, nil
}

// Audience is the service the verifier accepts tokens for.
func (v *Verifier) Audience() string { return v.audience }

// Verify checks tok (without the "Bearer " scheme) and returns its issuer. The token's
// form is checked first, then its signature against the issuer's public key, and only then
// is anything it claims believed: the audience must be this verifier's, the lifetime at
// most MaxLifetime, issued-at no later than now+ClockSkew and the expiry after
// now-ClockSkew. Errors wrap one of the Err* values above and name the issuer once it is
// known.
func (v *Verifier) Verify(tok string, now time.Time) (issuer string, err error) {
	v.mu.Lock()
	c, ok := v.verified[tok]
	v.mu.Unlock()
	if ok {
		if err := c.check(v.audience, now); err != nil {
			return "", err
		}
		return c.issuer, nil
	}
	c, err = parseToken(tok)
	if err != nil {
		return "", err
	}
	pub, ok := v.keys[c.issuer]
	if !ok {
		// Which issuers this server knows is not said to a caller it does not know.
		return "", fmt.Errorf("%w: %q", ErrUnknownIssuer, c.issuer)
	}
	if !ed25519.Verify(pub, []byte(c.payload), c.sig) {
		return "", fmt.Errorf("%w (token from %q)", ErrBadSignature, c.issuer)
	}
	if err := c.check(v.audience, now); err != nil {
		return "", err
	}
	v.remember(tok, c, now)
	return c.issuer, nil
}

func (v *Verifier) remember(tok string, c claims, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.verified) >= maxVerified {
		for k, e := range v.verified {
			if now.Unix() >= e.exp {
				delete(v.verified, k)
			}
		}
		if len(v.verified) >= maxVerified {
			clear(v.verified)
		}
	}
	v.verified[tok] = c
}

// claims is a parsed, not yet verified, token.
type claims struct {
	issuer, audience string
	iat, exp         int64
	payload          string
	sig              []byte
}

// parseToken checks tok's form only; nothing it returns is trusted before the signature.
func parseToken(tok string) (claims, error) {
	if len(tok) > maxTokenLen {
		return claims{}, fmt.Errorf("%w: longer than %d bytes", ErrMalformedToken, maxTokenLen)
	}
	parts := strings.Split(tok, ".")
	switch parts[0] {
	case tokenVersion:
	case oldTokenVersion:
		return claims{}, fmt.Errorf("%w: version %s (shared-key tokens) is no longer accepted; want %s, signed with the caller's own key", ErrMalformedToken, oldTokenVersion, tokenVersion)
	default:
		return claims{}, fmt.Errorf("%w: version %q, want %s", ErrMalformedToken, parts[0], tokenVersion)
	}
	if len(parts) != 6 {
		return claims{}, fmt.Errorf("%w: want %s.<issuer>.<audience>.<issued-at>.<expiry>.<signature>", ErrMalformedToken, tokenVersion)
	}
	c := claims{issuer: parts[1], audience: parts[2]}
	for _, f := range []struct{ name, v string }{{"issuer", c.issuer}, {"audience", c.audience}} {
		if !validService(f.v) {
			return claims{}, fmt.Errorf("%w: %s %q is not a service name", ErrMalformedToken, f.name, f.v)
		}
	}
	var err error
	if c.iat, err = parseUnix(parts[3]); err != nil {
		return claims{}, fmt.Errorf("%w: issued-at %q is not a unix time in seconds", ErrMalformedToken, parts[3])
	}
	if c.exp, err = parseUnix(parts[4]); err != nil {
		return claims{}, fmt.Errorf("%w: expiry %q is not a unix time in seconds", ErrMalformedToken, parts[4])
	}
	sig := parts[5]
	if c.sig, err = base64.RawURLEncoding.Strict().DecodeString(sig); err != nil || len(c.sig) != ed25519.SignatureSize {
		return claims{}, fmt.Errorf("%w: signature is not %d bytes of unpadded base64url", ErrMalformedToken, ed25519.SignatureSize)
	}
	c.payload = tok[:len(tok)-len(sig)-1]
	return c, nil
}

// check applies the rules to signed claims: a pure function of the claims, the verifier's
// audience and the time.
func (c claims) check(audience string, now time.Time) error {
	if c.audience != audience {
		return fmt.Errorf("%w: %q's token is for %q, this is %q", ErrWrongAudience, c.issuer, c.audience, audience)
	}
	iat, exp := time.Unix(c.iat, 0), time.Unix(c.exp, 0)
	// In seconds, so absurd times cannot overflow a Duration.
	if life := c.exp - c.iat; life <= 0 || life > int64(MaxLifetime/time.Second) {
		return fmt.Errorf("%w: %q's token runs from %s to %s; it must end after it starts and last at most %s",
			ErrTokenLifetime, c.issuer, iat.UTC().Format(time.RFC3339), exp.UTC().Format(time.RFC3339), MaxLifetime)
	}
	if iat.After(now.Add(ClockSkew)) {
		return fmt.Errorf("%w: %q's token is issued at %s, %s ahead of this server's clock (allowed skew %s)",
			ErrTokenNotYetValid, c.issuer, iat.UTC().Format(time.RFC3339), iat.Sub(now).Round(time.Second), ClockSkew)
	}
	if !now.Before(exp.Add(ClockSkew)) {
		return fmt.Errorf("%w: %q's token expired %s ago (at %s; allowed skew %s)",
			ErrTokenExpired, c.issuer, now.Sub(exp).Round(time.Second), exp.UTC().Format(time.RFC3339), ClockSkew)
	}
	return nil
}

// parseUnix accepts only plain decimal digits, so one time has one spelling.
func parseUnix(s string) (int64, error) {
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, errors.New("bad unix time")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("bad unix time")
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// audiences maps each handoff gRPC service to the name of the service that serves it: the
// audience of a token for a call to it. The names match gen/handoff/v1's ServiceDescs (a
// test holds them to it).
var audiences = map[string]string{
	"handoff.v1.CoordinatorService": "coordinator",
	"handoff.v1.AgentRunnerService": "agentrunner",
	"handoff.v1.WritebackService":   "writeback",
}

// audienceFor returns the audience of a call to fullMethod, or open when the method is
// always open (health, reflection) and needs no token.
func audienceFor(fullMethod string) (audience string, open bool, err error) {
	if alwaysOpen(fullMethod) {
		return "", true, nil
	}
	svc, _, ok := splitMethod(fullMethod)
	if !ok {
		return "", false, fmt.Errorf("identity: cannot mint a service token for method %q: not /pkg.Service/Method", fullMethod)
	}
	aud, ok := audiences[svc]
	if !ok {
		return "", false, fmt.Errorf("identity: cannot mint a service token for %s: %s is not a handoff service (known: %s)",
			fullMethod, svc, strings.Join(slices.Sorted(maps.Keys(audiences)), ", "))
	}
	return aud, false, nil
}

// PerRPCCredentials returns client credentials that send a token from the signer's service
// on every call (authorization: Bearer hst2...), addressed to the service the call goes to
// (read from the method: a call to WritebackService gets audience "writeback"), and
// minting a new one before the current one for that audience nears its expiry. Health and
// reflection calls carry no token; a call to any other service is refused, naming it. Use
// it with grpc.WithPerRPCCredentials.
//
// RequireTransportSecurity is false so the token can travel over plaintext, which is safe
// only on loopback inside one host (`handoff up`): over any network, use mTLS instead. The
// server interceptor refuses a token that arrives over plaintext from a non-loopback
// address.
func (s *Signer) PerRPCCredentials() credentials.PerRPCCredentials {
	return &tokenCredentials{s: s, cache: map[string]cachedToken{}}
}

type tokenCredentials struct {
	s *Signer

	mu    sync.Mutex
	cache map[string]cachedToken // by audience
}

type cachedToken struct {
	header string // the authorization value, "Bearer <token>": built once per token, not per call
	exp    time.Time
}

func (c *tokenCredentials) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, ok := credentials.RequestInfoFromContext(ctx)
	if !ok {
		return nil, errors.New("identity: no gRPC method in the call's context, so no token audience")
	}
	aud, open, err := audienceFor(ri.Method)
	if err != nil || open {
		return nil, err
	}
	return map[string]string{"authorization": c.header(aud)}, nil
}

// header returns the authorization value of the cached token for aud, or of a fresh one
// when it has under clientRefresh left.
func (c *tokenCredentials) header(aud string) string {
	now := c.s.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.cache[aud]
	if !ok || t.exp.Sub(now) < clientRefresh {
		iat, exp := now.Unix(), now.Add(clientTTL).Unix()
		t = cachedToken{header: "Bearer " + c.s.mint(aud, iat, exp), exp: time.Unix(exp, 0)}
		c.cache[aud] = t
	}
	return t.header
}

// RequireTransportSecurity is false: see Signer.PerRPCCredentials.
func (c *tokenCredentials) RequireTransportSecurity() bool { return false }
