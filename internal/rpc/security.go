package rpc

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

// Security is how a service proves who it is and learns who calls it. Two modes:
//
//   - mTLS (--certs DIR): every connection is TLS 1.3 with a certificate from the CA that
//     `handoff certs` made; the caller's identity is in its certificate. The production path.
//   - plaintext on loopback (--plaintext-loopback): no TLS, allowed only on a loopback
//     address; callers prove who they are with service tokens. A service signs the tokens
//     of the calls it makes with its own private key (--token-key-file) and accepts the
//     tokens that other services signed for it with their public keys (--token-public-keys),
//     so no service holds anything that mints another's identity. `handoff keys` makes them.
//
// Neither set is an error: a service never silently serves without an identity check.
type Security struct {
	CertsDir          string
	TokenKeyFile      string
	TokenPublicKeys   string
	PlaintextLoopback bool
}

// Bind registers the flags (with HANDOFF_* environment fallbacks).
func (s *Security) Bind(b *config.Binder) {
	b.String(&s.CertsDir, "certs", "HANDOFF_CERTS", "", "`DIR` made by 'handoff certs': serve and call with mTLS as this service")
	b.String(&s.TokenKeyFile, "token-key-file", "HANDOFF_TOKEN_KEY_FILE", "", "this service's own token key `FILE`, <service>.key from 'handoff keys' (mode 0600): signs the service tokens of the calls it makes, with --plaintext-loopback")
	b.String(&s.TokenPublicKeys, "token-public-keys", "HANDOFF_TOKEN_PUBLIC_KEYS", "", "`DIR` of <service>.pub public keys, public/ from 'handoff keys': accept service tokens these services signed for this one, with --plaintext-loopback")
	b.Bool(&s.PlaintextLoopback, "plaintext-loopback", "HANDOFF_PLAINTEXT_LOOPBACK", false, "serve without TLS; refused unless the listen address is loopback")
}

// publicKeys reads --token-public-keys, or returns nil when it is not set.
func (s *Security) publicKeys() (map[string]ed25519.PublicKey, error) {
	if s.TokenPublicKeys == "" {
		return nil, nil
	}
	keys, err := identity.LoadPublicKeys(s.TokenPublicKeys)
	if err != nil {
		return nil, fmt.Errorf("--token-public-keys: %w", err)
	}
	return keys, nil
}

// signer reads --token-key-file as service's key, or returns nil when it is not set. When
// --token-public-keys holds service's own public key, the two must be one pair: a service
// started with another's key file would otherwise fail on every call it makes.
func (s *Security) signer(service string, pubs map[string]ed25519.PublicKey) (*identity.Signer, error) {
	if s.TokenKeyFile == "" {
		return nil, nil
	}
	key, err := identity.LoadPrivateKey(s.TokenKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--token-key-file: %w", err)
	}
	sg, err := identity.NewSigner(service, key)
	if err != nil {
		return nil, fmt.Errorf("--token-key-file %s: %w", s.TokenKeyFile, err)
	}
	if pub, ok := pubs[service]; ok && !pub.Equal(sg.PublicKey()) {
		return nil, fmt.Errorf("--token-key-file %s is not %s's key: it does not match %s.pub in --token-public-keys %s", s.TokenKeyFile, service, service, s.TokenPublicKeys)
	}
	return sg, nil
}

// IsLoopback reports whether a listen address is on a loopback interface.
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Server returns the transport credentials (nil for plaintext) and the identity check
// for service listening on listen, with the platform's default policy and extra identity
// options (operator credentials). internal/server puts both on the service's server.
func (s *Security) Server(service, listen string, extra ...identity.Option) (credentials.TransportCredentials, *identity.Authorizer, error) {
	pubs, err := s.publicKeys()
	if err != nil {
		return nil, nil, err
	}
	// The server does not sign, but a bad key file is reported at start, not at the
	// first call this service makes.
	if _, err := s.signer(service, pubs); err != nil {
		return nil, nil, err
	}
	opts := append([]identity.Option{identity.WithPolicy(identity.DefaultPolicy())}, extra...)
	if pubs != nil {
		v, err := identity.NewVerifier(service, pubs)
		if err != nil {
			return nil, nil, fmt.Errorf("--token-public-keys %s: %w", s.TokenPublicKeys, err)
		}
		opts = append(opts, identity.WithVerifier(v))
	}
	var creds credentials.TransportCredentials
	switch {
	case s.CertsDir != "":
		cfg, err := certs.ServerTLS(s.CertsDir, service)
		if err != nil {
			return nil, nil, fmt.Errorf("--certs: %w", err)
		}
		creds = credentials.NewTLS(cfg)
	case s.PlaintextLoopback:
		if !IsLoopback(listen) {
			return nil, nil, fmt.Errorf("--plaintext-loopback: %s is not a loopback address; use --certs for anything reachable from another host", listen)
		}
	default:
		return nil, nil, errors.New("no transport security: set --certs DIR (mTLS; create it with `handoff certs`) or --plaintext-loopback with a loopback listen address")
	}
	return creds, identity.NewAuthorizer(opts...), nil
}

// Client returns the dial settings for service calling another service. Over plaintext,
// its calls carry tokens signed with --token-key-file, each addressed to the service called.
func (s *Security) Client(service string) (DialConfig, error) {
	if s.CertsDir != "" {
		cfg, err := certs.ClientTLS(s.CertsDir, service)
		if err != nil {
			return DialConfig{}, fmt.Errorf("--certs: %w", err)
		}
		return DialConfig{Creds: credentials.NewTLS(cfg)}, nil
	}
	pubs, err := s.publicKeys()
	if err != nil {
		return DialConfig{}, err
	}
	sg, err := s.signer(service, pubs)
	if err != nil {
		return DialConfig{}, err
	}
	if !s.PlaintextLoopback {
		return DialConfig{}, errors.New("no transport security: set --certs DIR or --plaintext-loopback")
	}
	dc := DialConfig{}
	if sg != nil {
		dc.PerRPC = sg.PerRPCCredentials()
	}
	return dc, nil
}
