// Package identity is the server interceptor that says who is calling, and lets a call
// through only when a policy allows that caller on that method.
//
// A caller proves its identity in one of two ways, tried in this order:
//
//  1. mTLS: a client certificate verified against the CA (see internal/certs). The service
//     is read from the URI SAN spiffe://handoff.local/<svc>, or from the subject CN when
//     the certificate has no spiffe:// URI. This is the way between separate processes.
//  2. A service token in the metadata, authorization: Bearer
//     hst2.<issuer>.<audience>.<issued-at>.<expiry>.<sig>, signed with the calling
//     service's own Ed25519 key (Signer). A server verifies it with public keys only
//     (Verifier), so no service can mint another's identity; the audience must be the
//     server's own service, and a token lives at most MaxLifetime (with ClockSkew of
//     leeway). This is for plaintext on loopback (`handoff up`, or the binaries with
//     --token-key-file and --token-public-keys), and is refused over plaintext from any
//     other address. The older shared-key hst1 tokens are refused.
//
// The interceptor puts the Identity in the context (FromContext) for the handler and the
// logging interceptor. Health checks and reflection are always open, so probes and
// `grpcurl list` work without credentials.
//
// Usage, following go-grpc-middleware v2:
//
//	grpc.NewServer(
//		grpc.Creds(credentials.NewTLS(serverTLS)),
//		grpc.ChainUnaryInterceptor(identity.UnaryServerInterceptor(identity.WithPolicy(identity.DefaultPolicy()))),
//		grpc.ChainStreamInterceptor(identity.StreamServerInterceptor(identity.WithPolicy(identity.DefaultPolicy()))),
//	)
package identity

import (
	"context"
	"log/slog"
)

// Ways an Identity was established (Identity.Method).
const (
	MethodMTLS  = "mtls"
	MethodToken = "token"
)

// TrustDomain is the SPIFFE trust domain of service identities; it matches
// internal/certs.TrustDomain.
const TrustDomain = "handoff.local"

// Identity is an authenticated caller.
type Identity struct {
	// Service is the calling service's name, e.g. "coordinator".
	Service string
	// Method is how the caller proved it: MethodMTLS, MethodToken or MethodOperatorToken.
	Method string
	// Name is the operator account's name when Method is MethodOperatorToken (or a web
	// session made from one); empty for services.
	Name string
	// Role is the operator account's role (RoleViewer, RoleResolver) when Name is set.
	Role string
}

// role is the operator role of id: its account's, or RoleResolver for an operator
// certificate or operator-key service token (they are not accounts and always decided).
func (id Identity) role() string {
	switch {
	case id.Service != OperatorService:
		return ""
	case id.Role != "":
		return id.Role
	case id.Name == "":
		return RoleResolver
	}
	return ""
}

// String returns e.g. `coordinator (mtls)`, or `operator alice (operator-token)`.
func (id Identity) String() string {
	if id.Name != "" {
		return id.Service + " " + id.Name + " (" + id.Method + ")"
	}
	return id.Service + " (" + id.Method + ")"
}

// LogValue logs the identity as a group: caller.service, caller.auth and, for an operator,
// caller.name.
func (id Identity) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("service", id.Service), slog.String("auth", id.Method)}
	if id.Name != "" {
		attrs = append(attrs, slog.String("name", id.Name))
	}
	return slog.GroupValue(attrs...)
}

type ctxKey struct{}

// NewContext returns a context that carries id.
func NewContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the caller's identity, if the interceptor established one. A call
// to a method open to anyone ("*") may have none.
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// Fields returns the caller as key/value pairs for a logger (caller.service, caller.auth),
// or nil when the context carries no identity.
func Fields(ctx context.Context) []any {
	id, ok := FromContext(ctx)
	if !ok {
		return nil
	}
	return []any{"caller.service", id.Service, "caller.auth", id.Method}
}
