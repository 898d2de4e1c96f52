package stack_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/stack"
	"github.com/handoffhq/handoff/internal/telemetry"
)

// TestMetrics checks the Prometheus endpoint counts RPCs per method and acks per status.
func TestMetrics(t *testing.T) {
	st, err := stack.Start(context.Background(), stack.Config{DataDir: t.TempDir(), CoordinatorAddr: "127.0.0.1:0", RunnerAddr: "127.0.0.1:0", WritebackAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	cc, err := st.Dial(st.RunnerAddr)
	if err != nil {
		t.Fatal(err)
	}
	runner := handoffv1.NewAgentRunnerServiceClient(cc)
	bad := &handoffv1.CheckRequest{Package: &handoffv1.HandoffPackage{Schema: "handoff.v1", Stage: "draft"}}
	for range 2 {
		resp, err := runner.Check(context.Background(), bad)
		if err != nil || resp.GetAck().GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
			t.Fatalf("Check(bad) = %v, %v; want REJECTED_SCHEMA", resp, err)
		}
	}
	srv := httptest.NewServer(telemetry.Handler(st.Registry))
	defer srv.Close()
	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`handoff_acks_total{grpc_method="Check",service="agentrunner",status="REJECTED_SCHEMA"} 2`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Check",grpc_service="handoff.v1.AgentRunnerService",grpc_type="unary",service="agentrunner"} 2`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Write",grpc_service="handoff.v1.WritebackService",grpc_type="unary",service="writeback"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
