package rpc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/config"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

// Security is how a service proves who it is and learns who calls it. Two modes:
//
//   - mTLS (--certs DIR): every connection is TLS 1.3 with a certificate from the CA that
//     `handoff certs` made; the caller's identity is in its certificate.
//   - plaintext on loopback (--plaintext-loopback): no TLS, allowed only on a loopback
//     address; callers prove who they are with service tokens signed with the key in
//     --token-key-file, which every service of the deployment shares.
//
// Neither set is an error: a service never silently serves without an identity check.
type Security struct {
	CertsDir          string
	TokenKeyFile      string
	PlaintextLoopback bool
}

// Bind registers the flags (with HANDOFF_* environment fallbacks).
func (s *Security) Bind(b *config.Binder) {
	b.String(&s.CertsDir, "certs", "HANDOFF_CERTS", "", "folder made by `handoff certs`: serve and call with mTLS as this service")
	b.String(&s.TokenKeyFile, "token-key-file", "HANDOFF_TOKEN_KEY_FILE", "", "file with the shared service-token key (32+ bytes), for --plaintext-loopback")
	b.Bool(&s.PlaintextLoopback, "plaintext-loopback", "HANDOFF_PLAINTEXT_LOOPBACK", false, "serve without TLS; refused unless the listen address is loopback")
}

func (s *Security) signer() (*identity.Signer, error) {
	if s.TokenKeyFile == "" {
		return nil, nil
	}
	key, err := os.ReadFile(s.TokenKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--token-key-file: %w", err)
	}
	sg, err := identity.NewSigner(bytes.TrimSpace(key))
	if err != nil {
		return nil, fmt.Errorf("--token-key-file %s: %w", s.TokenKeyFile, err)
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

// Server returns the transport credentials (nil for plaintext) and the identity
// interceptors for service listening on listen, with the platform's default policy and
// extra identity options (operator credentials).
func (s *Security) Server(service, listen string, extra ...identity.Option) (credentials.TransportCredentials, grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor, error) {
	sg, err := s.signer()
	if err != nil {
		return nil, nil, nil, err
	}
	opts := append([]identity.Option{identity.WithPolicy(identity.DefaultPolicy())}, extra...)
	if sg != nil {
		opts = append(opts, identity.WithSigner(sg))
	}
	var creds credentials.TransportCredentials
	switch {
	case s.CertsDir != "":
		cfg, err := certs.ServerTLS(s.CertsDir, service)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--certs: %w", err)
		}
		creds = credentials.NewTLS(cfg)
	case s.PlaintextLoopback:
		if !IsLoopback(listen) {
			return nil, nil, nil, fmt.Errorf("--plaintext-loopback: %s is not a loopback address; use --certs for anything reachable from another host", listen)
		}
	default:
		return nil, nil, nil, errors.New("no transport security: set --certs DIR (mTLS; create it with `handoff certs`) or --plaintext-loopback with a loopback listen address")
	}
	authz := identity.NewAuthorizer(opts...)
	return creds, authz.UnaryServerInterceptor(), authz.StreamServerInterceptor(), nil
}

// Client returns the dial settings for service calling another service.
func (s *Security) Client(service string) (DialConfig, error) {
	if s.CertsDir != "" {
		cfg, err := certs.ClientTLS(s.CertsDir, service)
		if err != nil {
			return DialConfig{}, fmt.Errorf("--certs: %w", err)
		}
		return DialConfig{Creds: credentials.NewTLS(cfg)}, nil
	}
	sg, err := s.signer()
	if err != nil {
		return DialConfig{}, err
	}
	if !s.PlaintextLoopback {
		return DialConfig{}, errors.New("no transport security: set --certs DIR or --plaintext-loopback")
	}
	dc := DialConfig{}
	if sg != nil {
		dc.PerRPC = sg.PerRPCCredentials(service)
	}
	return dc, nil
}
