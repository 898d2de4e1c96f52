package rpc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/certs"
)

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:50051": true, "[::1]:1": true, "localhost:9": true, "127.3.4.5:0": true,
		"0.0.0.0:50051": false, ":50051": false, "10.0.0.1:1": false, "nonsense": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestSecurityServer(t *testing.T) {
	dir := t.TempDir()
	if err := certs.Generate(dir, []string{"writeback", "coordinator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(t.TempDir(), "short.key")
	os.WriteFile(short, []byte("too short"), 0o600)
	good := filepath.Join(t.TempDir(), "good.key")
	os.WriteFile(good, []byte(strings.Repeat("k", 40)+"\n"), 0o600)
	tests := []struct {
		name    string
		sec     Security
		listen  string
		wantErr string
		tls     bool
	}{
		{"nothing set fails closed", Security{}, "127.0.0.1:1", "--certs", false},
		{"plaintext off loopback", Security{PlaintextLoopback: true}, "0.0.0.0:1", "not a loopback", false},
		{"short token key", Security{PlaintextLoopback: true, TokenKeyFile: short}, "127.0.0.1:1", "--token-key-file", false},
		{"missing certs", Security{CertsDir: t.TempDir()}, "0.0.0.0:1", "--certs", false},
		{"plaintext loopback with key", Security{PlaintextLoopback: true, TokenKeyFile: good}, "127.0.0.1:1", "", false},
		{"mtls", Security{CertsDir: dir}, "0.0.0.0:1", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			creds, u, s, err := tt.sec.Server("writeback", tt.listen)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || u == nil || s == nil || (creds != nil) != tt.tls {
				t.Fatalf("Server = %v, %v, %v, %v", creds, u != nil, s != nil, err)
			}
			dc, err := tt.sec.Client("coordinator")
			if err != nil || (dc.Creds != nil) != tt.tls || (!tt.tls && dc.PerRPC == nil) {
				t.Fatalf("Client = %+v, %v", dc, err)
			}
		})
	}
}
