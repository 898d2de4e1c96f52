package identity_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

var (
	loopback = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	remote   = &net.TCPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 40000} // TEST-NET-1, never dialled
)

// caller describes how a unit test's call arrives.
type caller struct {
	cert  *x509.Certificate // a verified client certificate (mTLS)
	tls   bool              // TLS without a verified chain
	addr  net.Addr          // default loopback
	token []string          // authorization values
}

func (c caller) context() context.Context {
	ctx := context.Background()
	p := &peer.Peer{Addr: c.addr} // plaintext: no AuthInfo
	if p.Addr == nil {
		p.Addr = loopback
	}
	if c.cert != nil || c.tls {
		info := credentials.TLSInfo{State: tls.ConnectionState{}}
		if c.cert != nil {
			info.State.VerifiedChains = [][]*x509.Certificate{{c.cert}}
			info.State.PeerCertificates = []*x509.Certificate{c.cert}
		}
		p.AuthInfo = info
	}
	ctx = peer.NewContext(ctx, p)
	if len(c.token) > 0 {
		md := metadata.MD{}
		for _, v := range c.token {
			md.Append("authorization", v)
		}
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	return ctx
}

func spiffeCert(cn string, uris ...string) *x509.Certificate {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: cn}}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			panic(err)
		}
		c.URIs = append(c.URIs, parsed)
	}
	return c
}

// call runs the unary interceptor with a handler that records whether it ran and the
// identity it saw.
func call(ctx context.Context, method string, opts ...identity.Option) (ran bool, id identity.Identity, hasID bool, err error) {
	_, err = identity.UnaryServerInterceptor(opts...)(ctx, "req", &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		ran = true
		id, hasID = identity.FromContext(ctx)
		return "resp", nil
	})
	return ran, id, hasID, err
}

const (
	write   = "/handoff.v1.WritebackService/Write"
	deliver = "/handoff.v1.AgentRunnerService/Deliver"
	check   = "/handoff.v1.AgentRunnerService/Check"
	submit  = "/handoff.v1.CoordinatorService/SubmitJob"
)

func TestUnaryInterceptor(t *testing.T) {
	// The interceptor does not look at the audience beyond the verifier's check, so every
	// token here is for the verifier's own service whatever the method.
	r := newRing(t)
	v := r.verifier(t, "writeback")
	tok := func(svc string) []string { return []string{"Bearer " + token(t, r[svc], "writeback")} }
	defaults := []identity.Option{identity.WithPolicy(identity.DefaultPolicy()), identity.WithVerifier(v)}
	now := time.Now().Unix()
	otherKey, err := identity.NewSigner("coordinator", seededKey(9))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		method string
		caller caller
		opts   []identity.Option // default: DefaultPolicy and the signer
		code   codes.Code
		msg    []string
		want   identity.Identity // when OK and identified
	}{
		// mTLS
		{name: "mtls spiffe allowed", method: write, caller: caller{cert: spiffeCert("ignored", "spiffe://handoff.local/coordinator")},
			want: identity.Identity{Service: "coordinator", Method: "mtls"}},
		{name: "mtls spiffe wins over CN", method: write, caller: caller{cert: spiffeCert("coordinator", "spiffe://handoff.local/agentrunner")},
			code: codes.PermissionDenied, msg: []string{`caller "agentrunner" (mtls) may not call /handoff.v1.WritebackService/Write; allowed callers: coordinator`}},
		{name: "mtls CN fallback", method: write, caller: caller{cert: spiffeCert("coordinator", "https://example.com/x")},
			want: identity.Identity{Service: "coordinator", Method: "mtls"}},
		{name: "mtls from any address", method: write, caller: caller{cert: spiffeCert("coordinator"), addr: remote},
			want: identity.Identity{Service: "coordinator", Method: "mtls"}},
		{name: "mtls other trust domain", method: write, caller: caller{cert: spiffeCert("coordinator", "spiffe://evil.example/coordinator")},
			code: codes.Unauthenticated, msg: []string{"outside trust domain handoff.local"}},
		{name: "mtls nested path", method: write, caller: caller{cert: spiffeCert("coordinator", "spiffe://handoff.local/ns/coordinator")},
			code: codes.Unauthenticated, msg: []string{"is not spiffe://handoff.local/<service>"}},
		{name: "mtls two spiffe ids", method: write, caller: caller{cert: spiffeCert("", "spiffe://handoff.local/coordinator", "spiffe://handoff.local/operator")},
			code: codes.Unauthenticated, msg: []string{"2 spiffe:// URI SANs"}},
		{name: "mtls CN not a name", method: write, caller: caller{cert: spiffeCert("Handoff CA")},
			code: codes.Unauthenticated, msg: []string{`CN "Handoff CA" is not a service name`}},
		{name: "mtls wins over token", method: write, caller: caller{cert: spiffeCert("coordinator"), token: tok("agentrunner")},
			want: identity.Identity{Service: "coordinator", Method: "mtls"}},
		{name: "tls without verified chain falls back to token", method: write, caller: caller{tls: true, addr: remote, token: tok("coordinator")},
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "tls without verified chain nor token", method: write, caller: caller{tls: true},
			code: codes.Unauthenticated, msg: []string{"no caller identity: present a client certificate or a service token"}},

		// Tokens
		{name: "token allowed", method: write, caller: caller{token: tok("coordinator")},
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "token scheme case-insensitive", method: write, caller: caller{token: []string{"bearer  " + token(t, r["coordinator"], "writeback")}},
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "token not allowed", method: write, caller: caller{token: tok("operator")},
			code: codes.PermissionDenied, msg: []string{`caller "operator" (token)`, write, "allowed callers: coordinator"}},
		{name: "token expired", method: write, caller: caller{token: []string{"Bearer " + r["coordinator"].Mint("writeback", now-120, now-60)}},
			code: codes.Unauthenticated, msg: []string{"service token expired"}},
		{name: "token wrong key", method: write, caller: caller{token: []string{"Bearer " + token(t, otherKey, "writeback")}},
			code: codes.Unauthenticated, msg: []string{"signature does not verify"}},
		{name: "token for another audience", method: write, caller: caller{token: []string{"Bearer " + token(t, r["coordinator"], "agentrunner")}},
			code: codes.Unauthenticated, msg: []string{`is for "agentrunner", this is "writeback"`}},
		{name: "token from an unknown issuer", method: write, caller: caller{token: []string{"Bearer " + token(t, newRing(t, "intruder")["intruder"], "writeback")}},
			code: codes.Unauthenticated, msg: []string{`unknown issuer: "intruder"`}},
		{name: "token over the max lifetime", method: write, caller: caller{token: []string{"Bearer " + r["coordinator"].Mint("writeback", now, now+3600)}},
			code: codes.Unauthenticated, msg: []string{"lifetime"}},
		{name: "token malformed", method: write, caller: caller{token: []string{"Bearer hst1.coordinator.12"}},
			code: codes.Unauthenticated, msg: []string{"malformed service token"}},
		{name: "token over plaintext from the network", method: write, caller: caller{addr: remote, token: tok("coordinator")},
			code: codes.Unauthenticated, msg: []string{"plaintext from 192.0.2.10:40000, not loopback"}},
		{name: "token over plaintext from IPv6 loopback", method: write, caller: caller{addr: &net.TCPAddr{IP: net.IPv6loopback}, token: tok("coordinator")},
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "token over a unix socket", method: write, caller: caller{addr: &net.UnixAddr{Name: "/run/h.sock", Net: "unix"}, token: tok("coordinator")},
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "token without verifier", method: write, caller: caller{token: tok("coordinator")}, opts: []identity.Option{identity.WithPolicy(identity.DefaultPolicy())},
			code: codes.Unauthenticated, msg: []string{"service tokens are not accepted"}},
		{name: "two tokens", method: write, caller: caller{token: append(tok("coordinator"), tok("coordinator")...)},
			code: codes.Unauthenticated, msg: []string{"more than one service token"}},
		{name: "other schemes are not ours", method: write, caller: caller{token: []string{"Basic dXNlcjpwYXNz"}},
			code: codes.Unauthenticated, msg: []string{"no caller identity"}},
		{name: "an operator token where none are accepted", method: write, caller: caller{token: []string{"Bearer op_abc123"}},
			code: codes.Unauthenticated, msg: []string{"operator tokens are not accepted"}},
		{name: "an operator token beside a service token", method: write, caller: caller{token: append([]string{"Bearer op_abc123"}, tok("coordinator")...)},
			code: codes.Unauthenticated, msg: []string{"a service token and an operator token"}},

		// No identity
		{name: "no identity on a protected method", method: write, caller: caller{},
			code: codes.Unauthenticated, msg: []string{"no caller identity: present a client certificate or a service token"}},
		{name: "no identity where anyone may call", method: check, caller: caller{addr: remote}},
		{name: "no identity may not submit", method: submit, caller: caller{},
			code: codes.Unauthenticated, msg: []string{"no caller identity"}},
		{name: "identity kept where anyone may call", method: check, caller: caller{token: tok("operator")},
			want: identity.Identity{Service: "operator", Method: "token"}},
		{name: "bad token refused even where anyone may call", method: check, caller: caller{token: []string{"Bearer hst1.x"}},
			code: codes.Unauthenticated, msg: []string{"malformed service token"}},

		// Always open
		{name: "health open", method: "/grpc.health.v1.Health/Check", caller: caller{addr: remote}},
		{name: "health watch open", method: "/grpc.health.v1.Health/Watch", caller: caller{}},
		{name: "reflection v1 open", method: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", caller: caller{}},
		{name: "reflection v1alpha open", method: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", caller: caller{}},
		{name: "health open with a bad token", method: "/grpc.health.v1.Health/Check", caller: caller{token: []string{"Bearer hst1.x"}}},
		{name: "health not closable by policy", method: "/grpc.health.v1.Health/Check", caller: caller{},
			opts: []identity.Option{identity.WithPolicy(identity.Policy{"/grpc.health.v1.Health/*": {}})}},
		{name: "lookalike of health is not open", method: "/grpc.health.v1.HealthX/Check", caller: caller{},
			code: codes.Unauthenticated},

		// DefaultPolicy lines
		{name: "agentrunner: coordinator", method: deliver, caller: caller{token: tok("coordinator")},
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "agentrunner: operator", method: deliver, caller: caller{token: tok("operator")},
			want: identity.Identity{Service: "operator", Method: "token"}},
		{name: "agentrunner: writeback denied", method: deliver, caller: caller{token: tok("writeback")},
			code: codes.PermissionDenied, msg: []string{"allowed callers: coordinator, operator"}},
		{name: "agentrunner: Check open to anyone", method: check, caller: caller{},
			want: identity.Identity{}},
		{name: "writeback: operator denied", method: write, caller: caller{cert: spiffeCert("operator")},
			code: codes.PermissionDenied},
		{name: "unlisted service denied by default", method: "/other.v1.Thing/Do", caller: caller{token: tok("coordinator")},
			code: codes.PermissionDenied, msg: []string{"no caller is allowed"}},
		{name: "unlisted service with default allow", method: "/other.v1.Thing/Do", caller: caller{token: tok("coordinator")},
			opts: append([]identity.Option{identity.WithDefaultAllow("coordinator")}, defaults...),
			want: identity.Identity{Service: "coordinator", Method: "token"}},
		{name: "default allow anyone", method: "/other.v1.Thing/Do", caller: caller{},
			opts: append([]identity.Option{identity.WithDefaultAllow(identity.Anyone)}, defaults...)},
		{name: "no policy denies all", method: write, caller: caller{token: tok("coordinator")}, opts: []identity.Option{identity.WithVerifier(v)},
			code: codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			if opts == nil {
				opts = defaults
			}
			ran, id, hasID, err := call(tt.caller.context(), tt.method, opts...)
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code %v (%v), want %v", got, err, tt.code)
			}
			if ran != (tt.code == codes.OK) {
				t.Errorf("handler ran: %v, want %v", ran, tt.code == codes.OK)
			}
			for _, m := range tt.msg {
				if !strings.Contains(status.Convert(err).Message(), m) {
					t.Errorf("message %q, want it to contain %q", status.Convert(err).Message(), m)
				}
			}
			if tt.code == codes.OK && (hasID != (tt.want != identity.Identity{}) || id != tt.want) {
				t.Errorf("handler saw identity %+v (%v), want %+v", id, hasID, tt.want)
			}
		})
	}
}

func TestPolicyExactAndWildcard(t *testing.T) {
	r := newRing(t, "a", "b", "c")
	v := r.verifier(t, "writeback")
	policy := identity.Policy{
		"/x.v1.S/*":      {"a"},
		"/x.v1.S/Exact":  {"b"},
		"/x.v1.S/Nobody": {},
		"/x.v1.S/Open":   {"*"},
		"/x.v1.T/Both":   {"a", "b"},
	}
	tests := []struct {
		method, svc string
		code        codes.Code
	}{
		{"/x.v1.S/Other", "a", codes.OK},
		{"/x.v1.S/Other", "b", codes.PermissionDenied},
		{"/x.v1.S/Exact", "b", codes.OK},
		{"/x.v1.S/Exact", "a", codes.PermissionDenied}, // the exact entry wins over the wildcard
		{"/x.v1.S/Nobody", "a", codes.PermissionDenied},
		{"/x.v1.S/Open", "c", codes.OK},
		{"/x.v1.S/Open", "", codes.OK},
		{"/x.v1.T/Both", "a", codes.OK},
		{"/x.v1.T/Both", "b", codes.OK},
		{"/x.v1.T/Other", "a", codes.PermissionDenied}, // T has no wildcard
		{"/x.v1.S/Other", "", codes.Unauthenticated},
		{"/x.v1.SS/Other", "a", codes.PermissionDenied}, // a wildcard matches its service only
	}
	for _, tt := range tests {
		t.Run(tt.method+" by "+tt.svc, func(t *testing.T) {
			c := caller{}
			if tt.svc != "" {
				c.token = []string{"Bearer " + token(t, r[tt.svc], "writeback")}
			}
			_, _, _, err := call(c.context(), tt.method, identity.WithPolicy(policy), identity.WithVerifier(v))
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code %v (%v), want %v", got, err, tt.code)
			}
		})
	}
	// The interceptor keeps its own copy of the policy.
	icpt := identity.UnaryServerInterceptor(identity.WithPolicy(policy), identity.WithVerifier(v))
	policy["/x.v1.S/*"] = []string{"z"}
	c := caller{token: []string{"Bearer " + token(t, r["a"], "writeback")}}
	if _, err := icpt(c.context(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/Other"}, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Errorf("policy changed under the interceptor: %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := identity.DefaultPolicy().Validate(); err != nil {
		t.Fatalf("DefaultPolicy: %v", err)
	}
	tests := []struct {
		name   string
		policy identity.Policy
		want   string
	}{
		{"no leading slash", identity.Policy{"handoff.v1.WritebackService/*": {"coordinator"}}, "want /pkg.Service/Method"},
		{"service only", identity.Policy{"/handoff.v1.WritebackService": {"coordinator"}}, "want /pkg.Service/Method"},
		{"bad caller", identity.Policy{"/a.S/*": {"Coordinator"}}, `"Coordinator" is neither a service name nor "*"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.policy.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %q", err, tt.want)
			}
			defer func() {
				if r := recover(); r == nil {
					t.Error("interceptor accepted an invalid policy")
				}
			}()
			identity.UnaryServerInterceptor(identity.WithPolicy(tt.policy))
		})
	}
}

func TestDefaultAllowValidated(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "WithDefaultAllow") {
			t.Errorf("recover() = %v, want a panic naming WithDefaultAllow", r)
		}
	}()
	identity.StreamServerInterceptor(identity.WithDefaultAllow("coordinator", "Not A Name"))
}

func TestDefaultPolicyIsFresh(t *testing.T) {
	p := identity.DefaultPolicy()
	p["/handoff.v1.WritebackService/*"] = append(p["/handoff.v1.WritebackService/*"], "agentrunner")
	if got := identity.DefaultPolicy()["/handoff.v1.WritebackService/*"]; len(got) != 1 || got[0] != "coordinator" {
		t.Errorf("DefaultPolicy shares state: %v", got)
	}
}

// fakeStream is the part of a server stream the interceptor uses.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }

func TestStreamInterceptor(t *testing.T) {
	r := newRing(t)
	icpt := identity.StreamServerInterceptor(identity.WithPolicy(identity.DefaultPolicy()), identity.WithVerifier(r.verifier(t, "agentrunner")))
	tests := []struct {
		name   string
		method string
		caller caller
		code   codes.Code
		want   identity.Identity
	}{
		{"coordinator delivers", deliver, caller{token: []string{"Bearer " + token(t, r["coordinator"], "agentrunner")}}, codes.OK, identity.Identity{Service: "coordinator", Method: "token"}},
		{"mtls operator", deliver, caller{cert: spiffeCert("x", "spiffe://handoff.local/operator")}, codes.OK, identity.Identity{Service: "operator", Method: "mtls"}},
		{"writeback may not deliver", deliver, caller{token: []string{"Bearer " + token(t, r["writeback"], "agentrunner")}}, codes.PermissionDenied, identity.Identity{}},
		{"anonymous may not deliver", deliver, caller{}, codes.Unauthenticated, identity.Identity{}},
		{"anonymous may not watch a job", "/handoff.v1.CoordinatorService/WatchJob", caller{}, codes.Unauthenticated, identity.Identity{}},
		{"any service may watch a job", "/handoff.v1.CoordinatorService/WatchJob", caller{token: []string{"Bearer " + token(t, r["writeback"], "agentrunner")}}, codes.OK, identity.Identity{Service: "writeback", Method: "token"}},
		{"reflection open", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", caller{}, codes.OK, identity.Identity{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				ran   bool
				got   identity.Identity
				hasID bool
			)
			err := icpt("srv", fakeStream{ctx: tt.caller.context()}, &grpc.StreamServerInfo{FullMethod: tt.method, IsServerStream: true}, func(srv any, ss grpc.ServerStream) error {
				ran = true
				got, hasID = identity.FromContext(ss.Context())
				return nil
			})
			if status.Code(err) != tt.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tt.code)
			}
			if ran != (tt.code == codes.OK) {
				t.Errorf("handler ran: %v", ran)
			}
			if got != tt.want || hasID != (tt.want != identity.Identity{}) {
				t.Errorf("identity %+v (%v), want %+v", got, hasID, tt.want)
			}
		})
	}
}

func TestRefusalsAreLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	r := newRing(t)
	c := caller{token: []string{"Bearer " + token(t, r["agentrunner"], "writeback")}}
	_, _, _, err := call(c.context(), write, identity.WithPolicy(identity.DefaultPolicy()), identity.WithVerifier(r.verifier(t, "writeback")), identity.WithLogger(log))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("err %v", err)
	}
	for _, want := range []string{"identity: call refused", "grpc.method=" + write, "grpc.code=PermissionDenied", "peer.address=127.0.0.1:40000", "caller.service=agentrunner", "caller.auth=token"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log %q lacks %q", buf.String(), want)
		}
	}

	// A refused token is logged by its reason, never by its value.
	buf.Reset()
	tok := token(t, r["coordinator"], "agentrunner")
	c = caller{token: []string{"Bearer " + tok}}
	_, _, _, err = call(c.context(), write, identity.WithPolicy(identity.DefaultPolicy()), identity.WithVerifier(r.verifier(t, "writeback")), identity.WithLogger(log))
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(buf.String(), `is for \"agentrunner\"`) {
		t.Fatalf("err %v, log %q", err, buf.String())
	}
	if sig := tok[strings.LastIndex(tok, ".")+1:]; strings.Contains(buf.String(), sig) || strings.Contains(status.Convert(err).Message(), sig) {
		t.Errorf("the token's signature is in the log or the error: %q", buf.String())
	}
}

func TestContextHelpers(t *testing.T) {
	ctx := context.Background()
	if _, ok := identity.FromContext(ctx); ok {
		t.Error("identity in an empty context")
	}
	if f := identity.Fields(ctx); f != nil {
		t.Errorf("Fields of an empty context: %v", f)
	}
	id := identity.Identity{Service: "coordinator", Method: identity.MethodMTLS}
	ctx = identity.NewContext(ctx, id)
	if got, ok := identity.FromContext(ctx); !ok || got != id {
		t.Errorf("FromContext = %+v, %v", got, ok)
	}
	if f := identity.Fields(ctx); len(f) != 4 || f[1] != "coordinator" || f[3] != "mtls" {
		t.Errorf("Fields = %v", f)
	}
	if id.String() != "coordinator (mtls)" {
		t.Errorf("String = %q", id.String())
	}
}
