package identity

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// A service token is
//
//	hst1.<service>.<unix-expiry>.<base64url(HMAC-SHA256(key, "hst1.<service>.<unix-expiry>"))>
//
// (base64url without padding). It says "the holder of the process's key vouches that this
// call comes from <service> until <expiry>". It binds no audience, method or channel, so it
// is only as private as the connection it travels on: loopback, inside one process.
const tokenVersion = "hst1"

// MinKeySize is the shortest key NewSigner accepts: 32 bytes, the HMAC-SHA256 block of
// security.
const MinKeySize = 32

const (
	maxTokenLen = 256
	macLen      = sha256.Size
	// Tokens minted by PerRPCCredentials live clientTTL and are replaced once less than
	// clientRefresh is left, so a call never leaves with a token about to expire.
	clientTTL     = 5 * time.Minute
	clientRefresh = 2 * time.Minute
)

// Errors Verify wraps; test them with errors.Is.
var (
	ErrMalformedToken = errors.New("malformed service token")
	ErrBadSignature   = errors.New("service token signature does not match (wrong key or altered token)")
	ErrTokenExpired   = errors.New("service token expired")
)

var serviceName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validService reports whether svc is a service name: a DNS label, as internal/certs makes.
func validService(svc string) bool { return serviceName.MatchString(svc) }

// Signer mints and verifies service tokens with one shared key. Safe for concurrent use.
type Signer struct {
	key []byte
	now func() time.Time // the clock of Token and PerRPCCredentials; tests replace it
}

// NewSigner returns a Signer for key, which must be at least MinKeySize bytes and should
// be random (NewRandomSigner). The key is copied.
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < MinKeySize {
		return nil, fmt.Errorf("identity: signer key is %d bytes, need at least %d", len(key), MinKeySize)
	}
	return &Signer{key: append([]byte(nil), key...), now: time.Now}, nil
}

// NewRandomSigner returns a Signer with a fresh random 32-byte key: the per-process key
// of `handoff up`, shared by the services of that one process and by nobody else.
func NewRandomSigner() (*Signer, error) {
	key := make([]byte, MinKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("identity: random key: %w", err)
	}
	return NewSigner(key)
}

// Token returns a token naming service that expires ttl from now (at a whole second, so
// a ttl under a second may give a token that is already expired). service must be a
// service name (a DNS label); Verify rejects a token for any other.
func (s *Signer) Token(service string, ttl time.Duration) string {
	return s.token(service, s.now().Add(ttl).Unix())
}

func (s *Signer) token(service string, expiry int64) string {
	payload := tokenVersion + "." + service + "." + strconv.FormatInt(expiry, 10)
	return payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(payload))
}

func (s *Signer) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// Verify checks tok (without the "Bearer " scheme) and returns the service it names. The
// signature is compared in constant time and checked before anything the token claims is
// believed; then the expiry, against now. Errors wrap ErrMalformedToken, ErrBadSignature or
// ErrTokenExpired.
func (s *Signer) Verify(tok string, now time.Time) (service string, err error) {
	if len(tok) > maxTokenLen {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrMalformedToken, maxTokenLen)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 4 {
		return "", fmt.Errorf("%w: want %s.<service>.<unix-expiry>.<signature>", ErrMalformedToken, tokenVersion)
	}
	version, svc, exp, sig := parts[0], parts[1], parts[2], parts[3]
	if version != tokenVersion {
		return "", fmt.Errorf("%w: version %q, want %s", ErrMalformedToken, version, tokenVersion)
	}
	if !validService(svc) {
		return "", fmt.Errorf("%w: %q is not a service name", ErrMalformedToken, svc)
	}
	expiry, err := parseExpiry(exp)
	if err != nil {
		return "", fmt.Errorf("%w: expiry %q is not a unix time in seconds", ErrMalformedToken, exp)
	}
	mac, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || len(mac) != macLen {
		return "", fmt.Errorf("%w: signature is not %d bytes of unpadded base64url", ErrMalformedToken, macLen)
	}
	if !hmac.Equal(mac, s.mac(tok[:len(tok)-len(sig)-1])) {
		return "", fmt.Errorf("%w (token for %q)", ErrBadSignature, svc)
	}
	if at := time.Unix(expiry, 0); !now.Before(at) {
		return "", fmt.Errorf("%w: %q's token expired %s ago (at %s)", ErrTokenExpired, svc, now.Sub(at).Round(time.Second), at.UTC().Format(time.RFC3339))
	}
	return svc, nil
}

// parseExpiry accepts only plain decimal digits, so one expiry has one spelling.
func parseExpiry(s string) (int64, error) {
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, errors.New("bad expiry")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("bad expiry")
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// PerRPCCredentials returns client credentials that send a token for service on every
// call (authorization: Bearer hst1...), minting a new one before the current one comes
// near its expiry. Use it with grpc.WithPerRPCCredentials.
//
// RequireTransportSecurity is false so the token can travel over plaintext, which is safe
// only on loopback inside one host (`handoff up`): over any network, use mTLS instead. The
// server interceptor refuses a token that arrives over plaintext from a non-loopback
// address.
func (s *Signer) PerRPCCredentials(service string) credentials.PerRPCCredentials {
	return &tokenCredentials{s: s, service: service}
}

type tokenCredentials struct {
	s       *Signer
	service string

	mu  sync.Mutex
	tok string
	exp time.Time
}

func (c *tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if !validService(c.service) {
		return nil, fmt.Errorf("identity: cannot mint a service token for %q: not a service name", c.service)
	}
	now := c.s.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tok == "" || c.exp.Sub(now) < clientRefresh {
		expiry := now.Add(clientTTL).Unix()
		c.tok, c.exp = c.s.token(c.service, expiry), time.Unix(expiry, 0)
	}
	return map[string]string{"authorization": "Bearer " + c.tok}, nil
}

// RequireTransportSecurity is false: see Signer.PerRPCCredentials.
func (c *tokenCredentials) RequireTransportSecurity() bool { return false }
