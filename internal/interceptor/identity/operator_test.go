package identity

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const opTok = "operator-token-0123456789"

func TestNewOperatorsRefusesWeakAccounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		accs []Account
		want string
	}{
		{"none", nil, "no operator accounts"},
		{"short token", []Account{{Name: "ana", Role: RoleResolver, Token: "short"}}, "token is 5 bytes"},
		{"no name", []Account{{Token: opTok}}, "has no name"},
		{"service-token look-alike", []Account{{Name: "ana", Role: RoleResolver, Token: "hst2.coordinator.x.y.z.sig"}}, "looks like a service token"},
		{"no role", []Account{{Name: "ana", Token: opTok}}, `role "": want viewer or resolver`},
		{"unknown role", []Account{{Name: "ana", Role: "admin", Token: opTok}}, `role "admin"`},
		{"bad hash", []Account{{Name: "ana", Role: RoleViewer, TokenSHA256: "abc"}}, "64 hex digits"},
		{"token and hash", []Account{{Name: "ana", Role: RoleViewer, Token: opTok, TokenSHA256: strings.Repeat("a", 64)}}, "not both"},
		{"same token twice", []Account{{Name: "ana", Role: RoleResolver, Token: opTok}, {Name: "bo", Role: RoleResolver, Token: opTok}}, "used twice"},
	} {
		if _, err := NewOperators(nil, tc.accs...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// Failures are limited per host (not per connection), logged without the token, a success
// forgets them, and the allowance refills with time.
func TestOperatorFailuresLimitedPerHost(t *testing.T) {
	var logs bytes.Buffer
	ops, err := NewOperators(slog.New(slog.NewTextHandler(&logs, nil)), Account{Name: "ana", Role: RoleResolver, Token: opTok})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	ops.now = func() time.Time { return now }
	ctx := context.Background()
	if id, err := ops.Verify(ctx, "127.0.0.1:1000", opTok); err != nil || id != (Identity{Service: OperatorService, Method: MethodOperatorToken, Name: "ana", Role: RoleResolver}) {
		t.Fatalf("right token: %v %v", id, err)
	}
	wrong := "wrong-token-that-must-not-be-logged"
	for i := range failureBurst {
		if _, err := ops.Verify(ctx, fmt.Sprintf("127.0.0.1:%d", 2000+i), wrong); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("wrong token %d: %v, want Unauthenticated", i, err)
		}
	}
	if _, err := ops.Verify(ctx, "127.0.0.1:3000", opTok); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("right token after %d failures from one host: %v, want ResourceExhausted", failureBurst, err)
	}
	for range 3 {
		ops.Verify(ctx, "127.0.0.1:3000", wrong)
	}
	if n := strings.Count(logs.String(), "too many failures"); n != 1 {
		t.Fatalf("%d log lines for one lockout, want 1:\n%s", n, logs.String())
	}
	if _, err := ops.Verify(ctx, "[::1]:3000", opTok); err != nil {
		t.Fatalf("another host is not held back: %v", err)
	}
	now = now.Add(failureRefill)
	if _, err := ops.Verify(ctx, "127.0.0.1:3001", opTok); err != nil {
		t.Fatalf("after one refill period the right token passes: %v", err)
	}
	if _, err := ops.Verify(ctx, "127.0.0.1:3002", wrong); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a success forgot the failures, so one more wrong token is only Unauthenticated: %v", err)
	}
	if strings.Contains(logs.String(), wrong) || strings.Contains(logs.String(), opTok) {
		t.Fatalf("a token reached the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "source=127.0.0.1") || !strings.Contains(logs.String(), "too many failures") {
		t.Fatalf("refusals are logged with their source and reason:\n%s", logs.String())
	}
}

// The table of sources is bounded, and filling it neither frees a locked-out source nor
// gives each new address of a spray its own allowance.
func TestOperatorLimiterMemoryIsBounded(t *testing.T) {
	ops, err := NewOperators(slog.New(slog.DiscardHandler), Account{Name: "ana", Role: RoleResolver, Token: opTok})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range failureBurst {
		ops.Verify(ctx, "127.0.0.9:1", "nope-nope-nope-nope")
	}
	addr := func(i int) string { return fmt.Sprintf("127.%d.%d.%d:1", i>>16&255, i>>8&255, i&255) }
	for i := range maxSources + 500 {
		ops.Verify(ctx, addr(1+i), "nope-nope-nope-nope")
	}
	if n := len(ops.sources); n > maxSources+1 {
		t.Fatalf("%d sources remembered, want at most %d and the shared overflow", n, maxSources)
	}
	if _, err := ops.Verify(ctx, "127.0.0.9:1", opTok); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the locked-out source after the table filled: %v, want still ResourceExhausted", err)
	}
	// New addresses past the table share one allowance, which the spray has used up.
	if _, err := ops.Verify(ctx, addr(maxSources+1000), opTok); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a new address while the table is full of failing sources: %v, want the shared overflow's ResourceExhausted", err)
	}
}

// The operator page's path: an identity made elsewhere (a session) passes the same policy.
func TestAuthorizerAllow(t *testing.T) {
	a := NewAuthorizer(WithPolicy(DefaultPolicy()))
	resolve := "/handoff.v1.CoordinatorService/ResolveEscalation"
	if _, err := a.Allow(context.Background(), Identity{Service: "agentrunner", Method: MethodMTLS}, resolve); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agentrunner resolving: %v, want PermissionDenied", err)
	}
	ctx, err := a.Allow(context.Background(), Identity{Service: OperatorService, Method: "web-session", Name: "ana", Role: RoleResolver}, resolve)
	if err != nil {
		t.Fatalf("operator resolving: %v", err)
	}
	if id, ok := FromContext(ctx); !ok || id.Name != "ana" {
		t.Fatalf("the context carries %v, %v; want the operator", id, ok)
	}
}

// Operators are named people with roles: accounts come from a file that holds only token
// hashes; a viewer reads the queue and jobs, only a resolver (or an operator certificate,
// which is no account) decides, and the refusal says why.
func TestOperatorRoles(t *testing.T) {
	viewerTok, resolverTok := "viewer-token-0123456789", "resolver-token-0123456789"
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	accs, err := ParseAccounts("HANDOFF_OPERATORS", "# people\nana resolver "+hash(resolverTok)+";bo viewer "+strings.ToUpper(hash(viewerTok)))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := NewOperators(slog.New(slog.DiscardHandler), accs...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bo, err := ops.Verify(ctx, "127.0.0.1:1", viewerTok)
	if err != nil || bo.Name != "bo" || bo.Role != RoleViewer {
		t.Fatalf("viewer token: %v %v", bo, err)
	}
	ana, err := ops.Verify(ctx, "127.0.0.1:1", resolverTok)
	if err != nil || ana.Name != "ana" || ana.Role != RoleResolver {
		t.Fatalf("resolver token: %v %v", ana, err)
	}
	if r, ok := ops.Role("bo"); !ok || r != RoleViewer {
		t.Fatalf("Role(bo) = %q %v", r, ok)
	}
	if _, ok := ops.Role("cy"); ok {
		t.Fatal("Role of no account: found")
	}
	a := NewAuthorizer(WithPolicy(DefaultPolicy()))
	list, resolve, get := "/handoff.v1.CoordinatorService/ListEscalations", "/handoff.v1.CoordinatorService/ResolveEscalation", "/handoff.v1.CoordinatorService/GetJob"
	for _, m := range []string{list, get} {
		if _, err := a.Allow(ctx, bo, m); err != nil {
			t.Fatalf("viewer on %s: %v, want allowed", m, err)
		}
	}
	if _, err := a.Allow(ctx, bo, resolve); status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `operator "bo" is a viewer`) {
		t.Fatalf("viewer resolving: %v, want PermissionDenied naming the role", err)
	}
	if _, err := a.Allow(ctx, ana, resolve); err != nil {
		t.Fatalf("resolver resolving: %v", err)
	}
	if _, err := a.Allow(ctx, Identity{Service: OperatorService, Method: MethodMTLS}, resolve); err != nil {
		t.Fatalf("operator certificate resolving: %v", err)
	}
	for _, bad := range []string{"ana resolver", "ana boss " + hash("x"), ""} {
		if _, err := ParseAccounts("f", bad); err == nil {
			t.Errorf("ParseAccounts(%q): no error", bad)
		}
	}
	if err := (Policy{resolve: {"operator:admin"}}).Validate(); err == nil {
		t.Error(`policy value "operator:admin" validated`)
	}
}
