package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// msgNoIdentity is the Unauthenticated message for a protected method called without
// credentials.
const msgNoIdentity = "no caller identity: present a client certificate or a service token"

// UnaryServerInterceptor returns a unary server interceptor that establishes the caller's
// identity, refuses the call unless the policy allows it, and passes the identity to the
// handler in the context. It panics on an invalid policy (see Policy.Validate).
func UnaryServerInterceptor(opts ...Option) grpc.UnaryServerInterceptor {
	return NewAuthorizer(opts...).UnaryServerInterceptor()
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming methods.
func StreamServerInterceptor(opts ...Option) grpc.StreamServerInterceptor {
	return NewAuthorizer(opts...).StreamServerInterceptor()
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }

// authorize decides one call. It returns the context to hand on (with the identity, when
// there is one) or a status error.
func (o *options) authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	if alwaysOpen(fullMethod) {
		return ctx, nil
	}
	id, found, err := o.identify(ctx)
	if err != nil {
		if _, isStatus := status.FromError(err); isStatus {
			return nil, err // the operator check's own answer (ResourceExhausted), already logged
		}
		// A credential that is presented and fails is refused even where anyone may call:
		// a caller that believes it is authenticated must learn that it is not.
		return nil, o.refuse(ctx, fullMethod, codes.Unauthenticated, err.Error())
	}
	if found {
		ctx = NewContext(ctx, id)
	}
	if err := o.decide(ctx, fullMethod, id, found); err != nil {
		return nil, err
	}
	return ctx, nil
}

// decide applies the policy to a caller already identified (found) or anonymous.
func (o *options) decide(ctx context.Context, fullMethod string, id Identity, found bool) error {
	allowed, ok := o.policy.allowed(fullMethod)
	if !ok {
		allowed = o.defaultAllow
	}
	if slices.Contains(allowed, Anyone) {
		return nil
	}
	if !found {
		return o.refuse(ctx, fullMethod, codes.Unauthenticated, msgNoIdentity)
	}
	if slices.Contains(allowed, AnyIdentity) || slices.Contains(allowed, id.Service) {
		return nil
	}
	if r := id.role(); r != "" && slices.Contains(allowed, id.Service+":"+r) {
		return nil
	}
	if id.Service == OperatorService && slices.ContainsFunc(allowed, func(a string) bool { return strings.HasPrefix(a, OperatorService+":") }) {
		return o.refuse(ctx, fullMethod, codes.PermissionDenied,
			fmt.Sprintf("operator %q is a %s and may not call %s: it needs the role of %s", id.Name, id.role(), fullMethod, strings.Join(allowed, ", ")))
	}
	who := "no caller is allowed"
	if len(allowed) > 0 {
		who = "allowed callers: " + strings.Join(allowed, ", ")
	}
	return o.refuse(ctx, fullMethod, codes.PermissionDenied,
		fmt.Sprintf("caller %q (%s) may not call %s; %s", id.Service, id.Method, fullMethod, who))
}

func (o *options) refuse(ctx context.Context, fullMethod string, code codes.Code, msg string) error {
	if o.logger != nil {
		attrs := []any{"grpc.method", fullMethod, "grpc.code", code.String(), "reason", msg}
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			attrs = append(attrs, "peer.address", p.Addr.String())
		}
		if id, ok := FromContext(ctx); ok {
			attrs = append(attrs, "caller", id)
		}
		o.logger.WarnContext(ctx, "identity: call refused", attrs...)
	}
	return status.Error(code, msg)
}

// identify establishes the caller: from a verified client certificate first, then from a
// service token. found is false when the caller presented neither; err is set when it
// presented one that does not hold.
func (o *options) identify(ctx context.Context) (id Identity, found bool, err error) {
	return o.identifyAs(ctx, true)
}

// identifyAs is identify; withOperators false leaves operator tokens unchecked (found is
// false for a caller presenting only one), so nothing counts their failures.
func (o *options) identifyAs(ctx context.Context, withOperators bool) (id Identity, found bool, err error) {
	p, _ := peer.FromContext(ctx)
	var tlsInfo *credentials.TLSInfo
	if p != nil {
		switch ai := p.AuthInfo.(type) {
		case credentials.TLSInfo:
			tlsInfo = &ai
		case *credentials.TLSInfo:
			tlsInfo = ai
		}
	}
	// Only a verified chain counts: a certificate the TLS layer merely received (a server
	// that does not require and verify client certificates) proves nothing.
	if tlsInfo != nil && len(tlsInfo.State.VerifiedChains) > 0 && len(tlsInfo.State.VerifiedChains[0]) > 0 {
		svc, err := serviceFromCert(tlsInfo.State.VerifiedChains[0][0])
		if err != nil {
			return Identity{}, false, err
		}
		return Identity{Service: svc, Method: MethodMTLS}, true, nil
	}

	tok, found, err := serviceToken(ctx)
	if err != nil {
		return Identity{}, false, err
	}
	if !found {
		if !withOperators {
			return Identity{}, false, nil
		}
		return o.operator(ctx, p, tlsInfo)
	}
	if _, both, _ := operatorToken(ctx); both {
		return Identity{}, false, errors.New("authorization carries a service token and an operator token; send one")
	}
	if o.verifier == nil {
		return Identity{}, false, errors.New("service tokens are not accepted by this server; present a client certificate")
	}
	if tlsInfo == nil && p != nil && !localAddr(p.Addr) {
		return Identity{}, false, fmt.Errorf("service token refused: it came over plaintext from %s, not loopback; use mTLS between hosts", p.Addr)
	}
	svc, err := o.verifier.Verify(tok, o.now())
	if err != nil {
		return Identity{}, false, err
	}
	return Identity{Service: svc, Method: MethodToken}, true, nil
}

// operator identifies a caller by an operator token: a bearer value that is not a service
// token. found is false when the call carries none.
func (o *options) operator(ctx context.Context, p *peer.Peer, tlsInfo *credentials.TLSInfo) (Identity, bool, error) {
	tok, found, err := operatorToken(ctx)
	if err != nil || !found {
		return Identity{}, false, err
	}
	if o.operators == nil {
		return Identity{}, false, errors.New("operator tokens are not accepted by this server")
	}
	if tlsInfo == nil && p != nil && !localAddr(p.Addr) {
		return Identity{}, false, fmt.Errorf("operator token refused: it came over plaintext from %s, not loopback; use TLS between hosts", p.Addr)
	}
	source := ""
	if p != nil && p.Addr != nil {
		source = p.Addr.String()
	}
	id, err := o.operators.Verify(ctx, source, tok)
	if err != nil {
		return Identity{}, false, err
	}
	return id, true, nil
}

// serviceFromCert reads the service from a verified leaf certificate: the one
// spiffe://handoff.local/<svc> URI SAN, or the CN when the certificate has no spiffe URI.
func serviceFromCert(c *x509.Certificate) (string, error) {
	var ids []*url.URL
	for _, u := range c.URIs {
		if u.Scheme == "spiffe" { // url.Parse lower-cases the scheme
			ids = append(ids, u)
		}
	}
	switch len(ids) {
	case 0:
		if cn := c.Subject.CommonName; validService(cn) {
			return cn, nil
		}
		return "", fmt.Errorf("client certificate names no service: no spiffe://%s/<service> URI SAN, and CN %q is not a service name", TrustDomain, c.Subject.CommonName)
	case 1:
		u := ids[0]
		if u.Host != TrustDomain {
			return "", fmt.Errorf("client certificate identity %s is outside trust domain %s", u, TrustDomain)
		}
		svc := strings.TrimPrefix(u.Path, "/")
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || !validService(svc) {
			return "", fmt.Errorf("client certificate identity %s is not spiffe://%s/<service>", u, TrustDomain)
		}
		return svc, nil
	default:
		return "", fmt.Errorf("client certificate has %d spiffe:// URI SANs, want one", len(ids))
	}
}

// tokenScheme matches the version prefix of a service token (hst2., the refused hst1.,
// and any later hstN.), so an old or unknown version is refused rather than ignored.
var tokenScheme = regexp.MustCompile(`^hst[0-9]+\.`)

// serviceToken returns the service token from the authorization metadata. Values in
// another scheme are not ours and are left alone; a bearer token of another kind is an
// operator's (operatorToken); more than one service token is an error.
func serviceToken(ctx context.Context) (tok string, found bool, err error) {
	for _, v := range authorization(ctx) {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		rest = strings.TrimSpace(rest)
		if !strings.EqualFold(scheme, "bearer") || !tokenScheme.MatchString(rest) {
			continue
		}
		if found {
			return "", false, errors.New("more than one service token in authorization metadata")
		}
		tok, found = rest, true
	}
	return tok, found, nil
}

// authorization returns the call's authorization metadata values. ValueFromIncomingContext
// reads the one key; FromIncomingContext copied the whole metadata map, and a call is
// identified up to three times (the limits' tap, the interceptor, the check for a second
// kind of token), so the copies were most of identity's allocations.
func authorization(ctx context.Context) []string {
	return metadata.ValueFromIncomingContext(ctx, "authorization")
}

// operatorToken returns the bearer token of the authorization metadata that is not a
// service token; more than one is an error.
func operatorToken(ctx context.Context) (tok string, found bool, err error) {
	for _, v := range authorization(ctx) {
		scheme, rest, _ := strings.Cut(strings.TrimSpace(v), " ")
		rest = strings.TrimSpace(rest)
		if !strings.EqualFold(scheme, "bearer") || tokenScheme.MatchString(rest) {
			continue
		}
		if found {
			return "", false, errors.New("more than one operator token in authorization metadata")
		}
		tok, found = rest, true
	}
	return tok, found, nil
}

// localAddr reports whether a plaintext peer is on this host: a loopback IP, or an address
// that is not on an IP network at all (a Unix socket, an in-process pipe or bufconn).
func localAddr(a net.Addr) bool {
	switch a := a.(type) {
	case nil:
		return true
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UDPAddr:
		return a.IP.IsLoopback()
	case *net.IPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	switch a.Network() {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6", "ip", "ip4", "ip6":
		host := a.String()
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		ip := net.ParseIP(host)
		return ip != nil && ip.IsLoopback()
	}
	return true
}
