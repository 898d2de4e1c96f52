package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

// setenv sets each variable for the rest of the test.
func setenv(t *testing.T, env map[string]string) {
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func TestParseConfigDefaultsAndEnv(t *testing.T) {
	cfg, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen.Addr != "127.0.0.1:50053" || cfg.storePath != "./handoff-data/writeback.db" ||
		cfg.artifacts != "./handoff-data/artifacts" || cfg.webhookURL != "" ||
		cfg.pendingTTL != 2*time.Minute || cfg.receiptTTL != 0 || cfg.listen.Metrics != "" {
		t.Errorf("defaults %+v", cfg)
	}
	setenv(t, map[string]string{
		"HANDOFF_WRITEBACK_LISTEN":      "0.0.0.0:6000",
		"HANDOFF_STORE":                 "/data/wb.db",
		"HANDOFF_ARTIFACTS":             "/data/art",
		"HANDOFF_WEBHOOK_URL":           "https://hooks.example.com/x",
		"HANDOFF_METRICS_LISTEN":        "127.0.0.1:9464",
		"HANDOFF_WRITEBACK_PENDING_TTL": "90s",
		"HANDOFF_WRITEBACK_RECEIPT_TTL": "720h",
	})
	cfg, err = parse([]string{"--listen", ":7000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen.Addr != ":7000" || cfg.storePath != "/data/wb.db" || cfg.artifacts != "/data/art" ||
		cfg.webhookURL != "https://hooks.example.com/x" || cfg.listen.Metrics != "127.0.0.1:9464" ||
		cfg.pendingTTL != 90*time.Second || cfg.receiptTTL != 720*time.Hour {
		t.Errorf("flags over env %+v", cfg)
	}
}

func TestParseConfigSecurityFlags(t *testing.T) {
	t.Setenv("HANDOFF_PLAINTEXT_LOOPBACK", "true")
	t.Setenv("HANDOFF_TOKEN_KEY_FILE", "/etc/handoff/writeback.key")
	t.Setenv("HANDOFF_TOKEN_PUBLIC_KEYS", "/etc/handoff/public")
	cfg, err := parse([]string{"--certs", "/etc/handoff/certs"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.security.PlaintextLoopback || cfg.security.TokenKeyFile != "/etc/handoff/writeback.key" ||
		cfg.security.TokenPublicKeys != "/etc/handoff/public" || cfg.security.CertsDir != "/etc/handoff/certs" {
		t.Errorf("security %+v", cfg.security)
	}
	t.Setenv("HANDOFF_PLAINTEXT_LOOPBACK", "maybe")
	if _, err := parse(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "--plaintext-loopback") {
		t.Errorf("bad HANDOFF_PLAINTEXT_LOOPBACK: %v, want an error naming --plaintext-loopback", err)
	}
}

// parse checks a redis:// --store at start (store.ParseURL). The options each URL
// becomes are asserted in internal/store's TestParseURL, which holds these cases.
func TestParseConfigRedisStore(t *testing.T) {
	cases := map[string]bool{ // accepted?
		"redis://127.0.0.1:6379":            true,
		"redis://redis.internal:6380/2":     true,
		"redis://:s3cret@10.0.0.5:6379/0":   true,
		"redis://[::1]:6379/":               true,
		"redis://localhost:6379/15":         true,
		"redis://redis.internal:6379/1?x=1": false,
	}
	for raw, ok := range cases {
		cfg, err := parse([]string{"--store", raw}, io.Discard)
		if !ok {
			if err == nil {
				t.Errorf("%s: accepted", raw)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", raw, err)
			continue
		}
		if cfg.storePath != raw {
			t.Errorf("%s: --store %q", raw, cfg.storePath)
		}
	}
	cfg, err := parse([]string{"--store", "/var/lib/handoff/wb.db"}, io.Discard)
	if err != nil || cfg.storePath != "/var/lib/handoff/wb.db" {
		t.Errorf("bbolt path: %+v %v", cfg, err)
	}
}

// Without --certs or --plaintext-loopback the service does not start; nor does plaintext on
// a non-loopback address.
func TestRunRefusesWithoutTransportSecurity(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--store", filepath.Join(dir, "wb.db"), "--artifacts", filepath.Join(dir, "art")}
	cases := map[string]struct {
		args []string
		want string
	}{
		"neither":              {nil, "no transport security"},
		"plaintext off-host":   {[]string{"--plaintext-loopback", "--listen", "0.0.0.0:0"}, "not a loopback address"},
		"missing certificates": {[]string{"--certs", filepath.Join(dir, "nope")}, "--certs"},
	}
	for name, tc := range cases {
		var stderr bytes.Buffer
		if code := run(append(append([]string{}, base...), tc.args...), &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 naming %q", name, code, stderr.String(), tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "wb.db")); !os.IsNotExist(err) {
		t.Errorf("the store was created (%v) although the service refused to start", err)
	}
}

func TestParseConfigBadValuesNameTheFlag(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		flag string
	}{
		{[]string{"--listen", "nope"}, nil, "--listen"},
		{[]string{"--listen", "127.0.0.1:99999"}, nil, "--listen"},
		{nil, map[string]string{"HANDOFF_WRITEBACK_LISTEN": "localhost"}, "--listen"},
		{[]string{"--webhook-url", "ftp://x"}, nil, "--webhook-url"},
		{nil, map[string]string{"HANDOFF_WEBHOOK_URL": "not a url"}, "--webhook-url"},
		{[]string{"--pending-ttl", "soon"}, nil, "--pending-ttl"},
		{[]string{"--pending-ttl", "500ms"}, nil, "--pending-ttl"},
		{nil, map[string]string{"HANDOFF_WRITEBACK_PENDING_TTL": "soon"}, "HANDOFF_WRITEBACK_PENDING_TTL"},
		{[]string{"--receipt-ttl", "-1h"}, nil, "--receipt-ttl"},
		{[]string{"--webhook-timeout", "0s"}, nil, "--webhook-timeout"},
		{[]string{"--store-wait", "-1s"}, nil, "--store-wait"},
		{[]string{"--store", ""}, nil, "--store"},
		{[]string{"--webhook-url", "http://h", "--webhook-timeout", "2m"}, nil, "--webhook-timeout"},
		{[]string{"--metrics-listen", "9464"}, nil, "--metrics-listen"},
		{nil, map[string]string{"HANDOFF_METRICS_LISTEN": "localhost:x"}, "--metrics-listen"},
		{[]string{"--store", "redis://h"}, nil, "--store"},
		{[]string{"--store", "redis://h:6379/db"}, nil, "--store"},
		{[]string{"--store", "rediss://h:6379"}, nil, "--store"},
		{[]string{"--store", "redis://admin:pw@h:6379"}, nil, "--store"},
		{[]string{"extra"}, nil, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " ")+tc.flag, func(t *testing.T) {
			setenv(t, tc.env)
			_, err := parse(tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("%v %v: err %v, want it to name %s", tc.args, tc.env, err, tc.flag)
			}
		})
	}
}

// serve end to end, over mTLS and over plaintext loopback with service tokens: health is
// SERVING, the coordinator writes (and its repeat is a duplicate), the agent runner is
// refused, and /metrics counts the calls.
func TestServeEndToEnd(t *testing.T) {
	certsDir := t.TempDir()
	if err := certs.Generate(certsDir, []string{"writeback", "coordinator", "agentrunner"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	keys := t.TempDir()
	if _, err := identity.GenerateKeys(keys, []string{"writeback", "coordinator", "agentrunner"}, false); err != nil {
		t.Fatal(err)
	}
	signer := func(t *testing.T, as, keyOf string) *identity.Signer { // keyOf's key, naming as
		key, err := identity.LoadPrivateKey(identity.KeyFile(keys, keyOf))
		if err != nil {
			t.Fatal(err)
		}
		s, err := identity.NewSigner(as, key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// hst2 signs a token by hand, with any claims, the way the format says: what an
	// attacker holding keyOf's key would send.
	hst2 := func(t *testing.T, keyOf, iss, aud string, iat, exp int64) string {
		key, err := identity.LoadPrivateKey(identity.KeyFile(keys, keyOf))
		if err != nil {
			t.Fatal(err)
		}
		payload := fmt.Sprintf("hst2.%s.%s.%d.%d", iss, aud, iat, exp)
		return payload + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(payload)))
	}
	now := time.Now().Unix()
	modes := map[string]struct {
		flags []string
		dial  func(t *testing.T, caller string) []grpc.DialOption
		// refused are authorization values the server must refuse as Unauthenticated.
		refused map[string]string
	}{
		"mtls": {
			flags: []string{"--certs", certsDir},
			dial: func(t *testing.T, caller string) []grpc.DialOption {
				tc, err := certs.ClientTLS(certsDir, caller)
				if err != nil {
					t.Fatal(err)
				}
				return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
			},
		},
		"plaintext loopback": {
			flags: []string{"--plaintext-loopback", "--token-key-file", identity.KeyFile(keys, "writeback"), "--token-public-keys", filepath.Join(keys, identity.PublicDir)},
			dial: func(t *testing.T, caller string) []grpc.DialOption {
				return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
					grpc.WithPerRPCCredentials(signer(t, caller, caller).PerRPCCredentials())}
			},
			refused: map[string]string{
				"agentrunner's key claiming coordinator":   hst2(t, "agentrunner", "coordinator", "writeback", now, now+60),
				"writeback's own key claiming coordinator": hst2(t, "writeback", "coordinator", "writeback", now, now+60),
				"coordinator's token for agentrunner":      hst2(t, "coordinator", "coordinator", "agentrunner", now, now+60),
				"coordinator's token expiring in 2286":     hst2(t, "coordinator", "coordinator", "writeback", now, 9999999999),
				"coordinator's token issued an hour ahead": hst2(t, "coordinator", "coordinator", "writeback", now+3600, now+3660),
				"an hst1 shared-key token":                 "hst1.coordinator.9999999999.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
			},
		},
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
				"--store", filepath.Join(dir, "wb.db"), "--artifacts", filepath.Join(dir, "artifacts")}, mode.flags...)
			cfg, err := parse(args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			creds, authz, err := cfg.security.Server(service, cfg.listen.Addr)
			if err != nil {
				t.Fatal(err)
			}
			files, err := artifact.NewFiles(cfg.artifacts)
			if err != nil {
				t.Fatal(err)
			}
			art, err := files.Put(context.Background(), artifact.Ref{JobID: "tkt-1", Stage: "draft", Round: 1, Type: "reply_md",
				SchemaVersion: "reply_md.v1", MediaType: "text/markdown"}, []byte("# Reply\n"))
			if err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithCancel(context.Background())
			addrs := make(chan [2]net.Addr, 1)
			done := make(chan error, 1)
			go func() {
				done <- serve(ctx, cfg, transport{creds, authz}, slog.New(slog.DiscardHandler),
					func(g, m net.Addr) { addrs <- [2]net.Addr{g, m} })
			}()
			var grpcAddr, metricsAddr net.Addr
			select {
			case a := <-addrs:
				grpcAddr, metricsAddr = a[0], a[1]
			case err := <-done:
				t.Fatalf("serve: %v", err)
			case <-time.After(20 * time.Second):
				t.Fatal("serve did not start")
			}
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("serve returned %v after stop", err)
				}
			}()

			client := func(caller string) (*grpc.ClientConn, handoffv1.WritebackServiceClient) {
				conn, err := grpc.NewClient(grpcAddr.String(), mode.dial(t, caller)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close() })
				return conn, handoffv1.NewWritebackServiceClient(conn)
			}
			cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer ccancel()
			req := &handoffv1.WriteRequest{
				Package: &handoffv1.HandoffPackage{
					Schema: "handoff.v1", JobId: "tkt-1", Stage: "writeback", Goal: "Answer the customer",
					Artifacts: []*handoffv1.Artifact{art},
					Evaluator: &handoffv1.Evaluator{LastVerdict: handoffv1.Verdict_VERDICT_PASS, Rounds: 1},
					Budget:    &handoffv1.Budget{UsdRemainingMicros: 1000, RevisionsRemaining: 1, HopsRemaining: 1},
				},
				Artifact: proto.Clone(art).(*handoffv1.Artifact),
				Target:   "ledger",
			}

			conn, coordinator := client("coordinator")
			hc, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{Service: handoffv1.WritebackService_ServiceDesc.ServiceName})
			if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health: %v %v", hc, err)
			}
			_, runner := client("agentrunner")
			if _, err := runner.Write(cctx, req); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("agentrunner: %v, want PermissionDenied", err)
			}
			if len(mode.refused) > 0 {
				plain, err := grpc.NewClient(grpcAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				defer plain.Close()
				for name, tok := range mode.refused {
					ctx := metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tok)
					if _, err := handoffv1.NewWritebackServiceClient(plain).Write(ctx, req); status.Code(err) != codes.Unauthenticated {
						t.Errorf("%s: %v, want Unauthenticated", name, err)
					}
				}
			}
			first, err := coordinator.Write(cctx, req)
			if err != nil || first.GetDuplicate() || first.GetReceipt().GetIdempotencyKey() != "tkt-1:writeback:reply_md" {
				t.Fatalf("coordinator: %v %v", first, err)
			}
			again, err := coordinator.Write(cctx, req)
			if err != nil || !again.GetDuplicate() || !proto.Equal(again.GetReceipt(), first.GetReceipt()) {
				t.Fatalf("repeat: %v %v", again, err)
			}

			resp, err := http.Get("http://" + metricsAddr.String() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{
				`grpc_server_handled_total{grpc_code="OK",grpc_method="Write",grpc_service="handoff.v1.WritebackService",grpc_type="unary",service="writeback"} 2`,
				`grpc_server_handled_total{grpc_code="PermissionDenied",grpc_method="Write",grpc_service="handoff.v1.WritebackService",grpc_type="unary",service="writeback"} 1`,
			} {
				if !strings.Contains(string(body), want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
		})
	}
}

func TestHelpSaysWhatItIs(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, &out); code != 0 {
		t.Fatalf("--help exits %d, want 0", code)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.HasPrefix(first, "writeback: the only writer to external systems") {
		t.Errorf("first line %q; want it to say what the writeback is", first)
	}
	for _, want := range []string{"--pending-ttl duration", "HANDOFF_WRITEBACK_PENDING_TTL", "(default 2m0s)", "--certs DIR"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
}
