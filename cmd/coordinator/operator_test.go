package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/certs"
)

const testOperatorToken = "operator-token-for-tests-0123456789"

// serveCoordinator runs the binary's run() until the test ends and returns its address.
func serveCoordinator(t *testing.T, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	args := append([]string{"--listen", "127.0.0.1:0", "--store", filepath.Join(t.TempDir(), "c.db"), "--store-wait", "0s"}, extra...)
	go func() { done <- run(ctx, args, slog.New(slog.DiscardHandler), func(a net.Addr) { addrs <- a }) }()
	select {
	case a := <-addrs:
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("coordinator returned %v after stop", err)
			}
		})
		return a.String()
	case err := <-done:
		cancel()
		t.Fatalf("coordinator did not start: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("coordinator did not start in 20s")
	}
	return ""
}

func coordinatorClient(t *testing.T, addr string, opts ...grpc.DialOption) handoffv1.CoordinatorServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return handoffv1.NewCoordinatorServiceClient(cc)
}

func bearer(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

var approve = &handoffv1.ResolveEscalationRequest{RunId: "run_nope", Operator: "mallory", Escalation: 1,
	Action: &handoffv1.ResolveEscalationRequest_Approve{Approve: &handoffv1.ApproveAction{}}}

// callAll makes each call the policy decides on and returns its code by name.
func callAll(ctx context.Context, c handoffv1.CoordinatorServiceClient) map[string]codes.Code {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := map[string]codes.Code{}
	_, err := c.ResolveEscalation(ctx, approve)
	out["ResolveEscalation"] = status.Code(err)
	_, err = c.ListEscalations(ctx, &handoffv1.ListEscalationsRequest{})
	out["ListEscalations"] = status.Code(err)
	_, err = c.ListJobs(ctx, &handoffv1.ListJobsRequest{State: handoffv1.JobState_JOB_STATE_ESCALATED})
	out["ListJobs"] = status.Code(err)
	_, err = c.GetJob(ctx, &handoffv1.GetJobRequest{RunId: "run_nope"})
	out["GetJob"] = status.Code(err)
	w, err := c.WatchJob(ctx, &handoffv1.WatchJobRequest{RunId: "run_nope"})
	if err == nil {
		_, err = w.Recv()
	}
	out["WatchJob"] = status.Code(err)
	return out
}

func TestRunRefusesWithoutOperatorCredentials(t *testing.T) {
	t.Setenv("HANDOFF_OPERATOR_TOKEN", "")
	for _, args := range [][]string{
		{"--plaintext-loopback"},
		{"--plaintext-loopback", "--token-key-file", filepath.Join(t.TempDir(), "key")},
		{"--certs", t.TempDir()},
	} {
		err := run(context.Background(), append(args, "--listen", "127.0.0.1:0", "--store", filepath.Join(t.TempDir(), "c.db")), slog.New(slog.DiscardHandler), nil)
		if err == nil || !strings.Contains(err.Error(), "--operator-token") || !strings.Contains(err.Error(), "HANDOFF_OPERATOR_TOKEN") {
			t.Errorf("run(%v) without operator credentials = %v; want a refusal naming --operator-token", args, err)
		}
	}
	err := run(context.Background(), []string{"--plaintext-loopback", "--operator-token", "short"}, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "--operator-token is 5 bytes") {
		t.Errorf("a 5-byte operator token = %v; want it refused", err)
	}
}

// Operator calls take an operator; job data takes an identity. Over plaintext loopback the
// only identities are the operator token and service tokens: an anonymous caller reads
// nothing and decides nothing.
func TestOperatorCallsNeedAnOperatorPlaintext(t *testing.T) {
	addr := serveCoordinator(t, "--plaintext-loopback", "--operator-token", testOperatorToken)
	c := coordinatorClient(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	// In this order: the wrong token's five failures use up the address's allowance.
	for _, tc := range []struct {
		name string
		want map[string]codes.Code
	}{
		{"anonymous", map[string]codes.Code{"ResolveEscalation": codes.Unauthenticated, "ListEscalations": codes.Unauthenticated,
			"ListJobs": codes.Unauthenticated, "GetJob": codes.Unauthenticated, "WatchJob": codes.Unauthenticated}},
		{"operator", map[string]codes.Code{"ResolveEscalation": codes.NotFound, "ListEscalations": codes.OK,
			"ListJobs": codes.OK, "GetJob": codes.NotFound, "WatchJob": codes.NotFound}},
		{"wrong operator token", map[string]codes.Code{"ResolveEscalation": codes.Unauthenticated, "ListEscalations": codes.Unauthenticated,
			"ListJobs": codes.Unauthenticated, "GetJob": codes.Unauthenticated, "WatchJob": codes.Unauthenticated}},
	} {
		name, want := tc.name, tc.want
		ctx := context.Background()
		switch name {
		case "wrong operator token":
			ctx = bearer("not-the-operator-token-at-all")
		case "operator":
			ctx = bearer(testOperatorToken)
		}
		got := callAll(ctx, c)
		for m, code := range want {
			if got[m] != code {
				t.Errorf("%s: %s = %s, want %s", name, m, got[m], code)
			}
		}
	}
	// Submitting takes an identity: an anonymous caller could squat a job_id, or repeat
	// another client's request to be handed its run.
	submit := &handoffv1.SubmitJobRequest{JobId: "tkt_1", Pipeline: "nope", Goal: "g", Budget: &handoffv1.Budget{UsdRemainingMicros: 1000}}
	if _, err := c.SubmitJob(context.Background(), submit); status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous SubmitJob = %v; want Unauthenticated", err)
	}
	if _, err := c.SubmitJob(bearer(testOperatorToken), submit); status.Code(err) == codes.Unauthenticated || status.Code(err) == codes.PermissionDenied {
		t.Errorf("the operator's SubmitJob = %v; want it past the identity check", err)
	}
}

// Under mTLS a service certificate is an identity that may read jobs, but only an operator
// (certificate or token) decides: the agent runner's certificate cannot approve.
func TestOperatorCallsNeedAnOperatorMTLS(t *testing.T) {
	dir := t.TempDir()
	if err := certs.Generate(dir, []string{"coordinator", "agentrunner", "writeback", "operator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	addr := serveCoordinator(t, "--certs", dir, "--operator-token", testOperatorToken)
	as := func(svc string) handoffv1.CoordinatorServiceClient {
		tc, err := certs.ClientTLS(dir, svc)
		if err != nil {
			t.Fatal(err)
		}
		return coordinatorClient(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
	for svc, want := range map[string]map[string]codes.Code{
		"agentrunner": {"ResolveEscalation": codes.PermissionDenied, "ListEscalations": codes.PermissionDenied,
			"ListJobs": codes.OK, "GetJob": codes.NotFound, "WatchJob": codes.NotFound},
		"writeback": {"ResolveEscalation": codes.PermissionDenied, "ListEscalations": codes.PermissionDenied},
		"operator":  {"ResolveEscalation": codes.NotFound, "ListEscalations": codes.OK, "ListJobs": codes.OK},
	} {
		got := callAll(context.Background(), as(svc))
		for m, code := range want {
			if got[m] != code {
				t.Errorf("%s certificate: %s = %s, want %s", svc, m, got[m], code)
			}
		}
	}
	// A service certificate plus the operator token: the certificate is the identity, and
	// it is not an operator's.
	if got := callAll(bearer(testOperatorToken), as("agentrunner")); got["ResolveEscalation"] != codes.PermissionDenied {
		t.Errorf("agentrunner certificate with the operator token: ResolveEscalation = %s, want PermissionDenied", got["ResolveEscalation"])
	}
}

// Wrong operator tokens from one address are limited: past the allowance even the right
// token waits, and the refusal says so.
func TestOperatorTokenFailuresAreLimited(t *testing.T) {
	addr := serveCoordinator(t, "--plaintext-loopback", "--operator-token", testOperatorToken)
	c := coordinatorClient(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	var last error
	for range 10 {
		_, last = c.ListEscalations(bearer("guess-guess-guess-guess"), &handoffv1.ListEscalationsRequest{})
	}
	if status.Code(last) != codes.ResourceExhausted {
		t.Fatalf("the 10th wrong token = %v; want ResourceExhausted", last)
	}
	_, err := c.ListEscalations(bearer(testOperatorToken), &handoffv1.ListEscalationsRequest{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many failed operator credentials") {
		t.Fatalf("the right token right after = %v; want ResourceExhausted until the allowance refills", err)
	}
}

// Operator accounts from a file (token hashes only) and the environment: a viewer reads
// jobs and the queue over gRPC but may not decide; a resolver may.
func TestOperatorAccountsHaveRoles(t *testing.T) {
	viewer, resolver := "viewer-token-for-tests-0123456789", "resolver-token-for-tests-0123456789"
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte("# the desk\nbo viewer "+hash(viewer)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HANDOFF_OPERATORS", "ana resolver "+hash(resolver))
	addr := serveCoordinator(t, "--plaintext-loopback", "--operators-file", file)
	c := coordinatorClient(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	for tok, want := range map[string]map[string]codes.Code{
		viewer:   {"ResolveEscalation": codes.PermissionDenied, "ListEscalations": codes.OK, "ListJobs": codes.OK, "GetJob": codes.NotFound},
		resolver: {"ResolveEscalation": codes.NotFound, "ListEscalations": codes.OK, "ListJobs": codes.OK, "GetJob": codes.NotFound},
	} {
		got := callAll(bearer(tok), c)
		for m, code := range want {
			if got[m] != code {
				t.Errorf("%s: %s = %s, want %s", tok[:6], m, got[m], code)
			}
		}
	}
}
