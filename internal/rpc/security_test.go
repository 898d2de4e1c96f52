package rpc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/certs"
	"github.com/handoffhq/handoff/internal/interceptor/identity"
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
	keys := t.TempDir()
	if _, err := identity.GenerateKeys(keys, []string{"writeback", "coordinator", "agentrunner"}, false); err != nil {
		t.Fatal(err)
	}
	pubs := filepath.Join(keys, identity.PublicDir)
	wbKey, coordKey := identity.KeyFile(keys, "writeback"), identity.KeyFile(keys, "coordinator")
	old := filepath.Join(t.TempDir(), "token.key") // the shared hex key of hst1
	os.WriteFile(old, []byte(strings.Repeat("k", 40)+"\n"), 0o600)
	open := filepath.Join(t.TempDir(), "open.key")
	b, _ := os.ReadFile(wbKey)
	os.WriteFile(open, b, 0o644)
	os.Chmod(open, 0o644)
	withPrivate := t.TempDir() // a public folder that holds a private key too
	for _, f := range []string{identity.PublicKeyFile(keys, "coordinator"), wbKey} {
		b, _ := os.ReadFile(f)
		os.WriteFile(filepath.Join(withPrivate, filepath.Base(f)), b, 0o600)
	}
	tests := []struct {
		name    string
		sec     Security
		listen  string
		wantErr []string
		tls     bool
	}{
		{"nothing set fails closed", Security{}, "127.0.0.1:1", []string{"--certs"}, false},
		{"plaintext off loopback", Security{PlaintextLoopback: true}, "0.0.0.0:1", []string{"not a loopback"}, false},
		{"old shared token key", Security{PlaintextLoopback: true, TokenKeyFile: old}, "127.0.0.1:1", []string{"--token-key-file", old, "not a PEM private key", "handoff keys"}, false},
		{"missing token key", Security{PlaintextLoopback: true, TokenKeyFile: old + ".none"}, "127.0.0.1:1", []string{"--token-key-file", "no such file"}, false},
		{"token key readable by others", Security{PlaintextLoopback: true, TokenKeyFile: open, TokenPublicKeys: pubs}, "127.0.0.1:1", []string{"--token-key-file", open, "mode 0644"}, false},
		{"another service's key", Security{PlaintextLoopback: true, TokenKeyFile: coordKey, TokenPublicKeys: pubs}, "127.0.0.1:1",
			[]string{"--token-key-file " + coordKey + " is not writeback's key", "--token-public-keys " + pubs}, false},
		{"missing public keys", Security{PlaintextLoopback: true, TokenPublicKeys: filepath.Join(keys, "none")}, "127.0.0.1:1", []string{"--token-public-keys", "no such file"}, false},
		{"private key among the public ones", Security{PlaintextLoopback: true, TokenPublicKeys: withPrivate}, "127.0.0.1:1", []string{"--token-public-keys", "writeback.key is a private key"}, false},
		{"missing certs", Security{CertsDir: t.TempDir()}, "0.0.0.0:1", []string{"--certs"}, false},
		{"plaintext loopback with keys", Security{PlaintextLoopback: true, TokenKeyFile: wbKey, TokenPublicKeys: pubs}, "127.0.0.1:1", nil, false},
		{"plaintext loopback, public keys only", Security{PlaintextLoopback: true, TokenPublicKeys: pubs}, "127.0.0.1:1", nil, false},
		{"mtls", Security{CertsDir: dir}, "0.0.0.0:1", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			creds, authz, err := tt.sec.Server("writeback", tt.listen)
			if tt.wantErr != nil {
				for _, w := range tt.wantErr {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v, want one naming %q", err, w)
					}
				}
				return
			}
			if err != nil || authz == nil || (creds != nil) != tt.tls {
				t.Fatalf("Server = %v, %v, %v", creds, authz != nil, err)
			}
		})
	}
}

func TestSecurityClient(t *testing.T) {
	keys := t.TempDir()
	if _, err := identity.GenerateKeys(keys, []string{"writeback", "coordinator"}, false); err != nil {
		t.Fatal(err)
	}
	pubs := filepath.Join(keys, identity.PublicDir)
	sec := Security{PlaintextLoopback: true, TokenKeyFile: identity.KeyFile(keys, "coordinator"), TokenPublicKeys: pubs}
	if dc, err := sec.Client("coordinator"); err != nil || dc.Creds != nil || dc.PerRPC == nil {
		t.Fatalf("Client = %+v, %v; want plaintext with tokens", dc, err)
	}
	if _, err := sec.Client("writeback"); err == nil || !strings.Contains(err.Error(), "is not writeback's key") {
		t.Errorf("coordinator's key as writeback: %v", err)
	}
	if dc, err := (&Security{PlaintextLoopback: true}).Client("coordinator"); err != nil || dc.PerRPC != nil {
		t.Errorf("no key: %+v, %v; want plaintext without tokens", dc, err)
	}
	if _, err := (&Security{TokenKeyFile: sec.TokenKeyFile}).Client("coordinator"); err == nil || !strings.Contains(err.Error(), "--plaintext-loopback") {
		t.Errorf("no transport: %v", err)
	}
}
