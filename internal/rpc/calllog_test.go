package rpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/rpc"
	"github.com/handoffhq/handoff/internal/testkit"
)

// lockedBuf is a log destination the server's goroutines write to while the test reads.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the JSON log lines whose msg is "finished call".
func (l *lockedBuf) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if ln == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, ln)
		}
		if m["msg"] == "finished call" {
			out = append(out, m)
		}
	}
	return out
}

// failingRunner's Check answers OK; its Deliver ends Unavailable after one message.
type failingRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
}

func (failingRunner) Check(context.Context, *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	return &handoffv1.CheckResponse{}, nil
}

func (failingRunner) Deliver(_ *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	return status.Error(codes.Unavailable, "store down")
}

// The chain logs one "finished call" line per call whose code's level the logger writes:
// at warn (the services' default) an OK call writes nothing and an Unavailable one writes
// its line; at info the OK call is logged too. The line names the method, its type, the
// code, the error, the duration and the call's trace.
func TestFinishedCallLine(t *testing.T) {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tc := range []struct {
		name      string
		level     slog.Level
		wantCheck bool // the OK Check is logged
	}{
		{"warn level: only the failed call", slog.LevelWarn, false},
		{"info level: both calls", slog.LevelInfo, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := &lockedBuf{}
			log := slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: tc.level}))
			tp := sdktrace.NewTracerProvider()
			t.Cleanup(func() { tp.Shutdown(context.Background()) })
			g := rpc.NewServer(rpc.ServerConfig{Service: "calllog", Logger: log, TracerProvider: tp})
			handoffv1.RegisterAgentRunnerServiceServer(g, failingRunner{})
			client := handoffv1.NewAgentRunnerServiceClient(testkit.Dial(t, testkit.ServeTCP(t, g)))
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")

			if _, err := client.Check(ctx, &handoffv1.CheckRequest{}); err != nil {
				t.Fatal(err)
			}
			s, err := client.Deliver(ctx, &handoffv1.DeliverRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			if status.Code(err) != codes.Unavailable || err == io.EOF {
				t.Fatalf("Deliver: %v, want Unavailable", err)
			}

			lines := buf.lines(t)
			byMethod := map[string]map[string]any{}
			for _, l := range lines {
				byMethod[l["grpc.method"].(string)] = l
			}
			want := 1
			if tc.wantCheck {
				want = 2
			}
			if len(lines) != want {
				t.Fatalf("%d finished-call lines, want %d: %v", len(lines), want, lines)
			}
			d := byMethod["Deliver"]
			for k, v := range map[string]any{"level": "WARN", "grpc.code": "Unavailable", "grpc.method_type": "server_stream",
				"grpc.service": "handoff.v1.AgentRunnerService", "grpc.component": "server", "trace_id": traceID} {
				if d[k] != v {
					t.Errorf("Deliver line %s = %v, want %v (line %v)", k, d[k], v, d)
				}
			}
			if e, _ := d["grpc.error"].(string); !strings.Contains(e, "store down") {
				t.Errorf("Deliver line grpc.error = %v, want the status", d["grpc.error"])
			}
			if _, ok := d["grpc.time_ms"]; !ok {
				t.Errorf("Deliver line has no duration: %v", d)
			}
			if c, ok := byMethod["Check"]; tc.wantCheck && (!ok || c["grpc.code"] != "OK" || c["level"] != "INFO" || c["grpc.method_type"] != "unary") {
				t.Errorf("Check line = %v, want an INFO line with code OK, unary", c)
			}
		})
	}
}
