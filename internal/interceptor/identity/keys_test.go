package identity_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
)

func TestGenerateKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	svcs := []string{"coordinator", "writeback"}
	res, err := identity.GenerateKeys(dir, svcs, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{identity.KeyFile(dir, "coordinator"), identity.PublicKeyFile(dir, "coordinator"), identity.KeyFile(dir, "writeback"), identity.PublicKeyFile(dir, "writeback")}
	if !slices.Equal(res.Written, want) || len(res.Kept) != 0 {
		t.Fatalf("written %v, kept %v; want %v", res.Written, res.Kept, want)
	}
	for _, f := range want {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		perm := map[bool]fs.FileMode{true: 0o600, false: 0o644}[strings.HasSuffix(f, ".key")]
		if fi.Mode().Perm() != perm {
			t.Errorf("%s: mode %04o, want %04o", f, fi.Mode().Perm(), perm)
		}
	}

	// Each key signs tokens the public folder verifies, and only as its own service.
	pubs, err := identity.LoadPublicKeys(filepath.Join(dir, identity.PublicDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(pubs) != 2 {
		t.Fatalf("public keys %v", pubs)
	}
	v, err := identity.NewVerifier("writeback", pubs)
	if err != nil {
		t.Fatal(err)
	}
	key, err := identity.LoadPrivateKey(identity.KeyFile(dir, "coordinator"))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := identity.NewSigner("coordinator", key)
	if svc, err := v.Verify(token(t, s, "writeback"), time.Now()); err != nil || svc != "coordinator" {
		t.Errorf("coordinator's key: %q, %v", svc, err)
	}
	wbAsCoord, _ := identity.NewSigner("coordinator", must(identity.LoadPrivateKey(identity.KeyFile(dir, "writeback"))))
	if _, err := v.Verify(token(t, wbAsCoord, "writeback"), time.Now()); !errors.Is(err, identity.ErrBadSignature) {
		t.Errorf("writeback's key passed as coordinator: %v", err)
	}

	// A second run keeps what is there and rewrites a missing .pub from its key.
	os.Remove(identity.PublicKeyFile(dir, "writeback"))
	res, err = identity.GenerateKeys(dir, append(svcs, "operator"), false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Kept, identity.KeyFile(dir, "coordinator")) || !slices.Contains(res.Written, identity.PublicKeyFile(dir, "writeback")) ||
		!slices.Contains(res.Written, identity.KeyFile(dir, "operator")) || slices.Contains(res.Written, identity.KeyFile(dir, "coordinator")) {
		t.Errorf("second run: written %v, kept %v", res.Written, res.Kept)
	}
	if pub := must(identity.LoadPublicKey(identity.PublicKeyFile(dir, "writeback"))); !pub.Equal(must(identity.LoadPrivateKey(identity.KeyFile(dir, "writeback"))).Public()) {
		t.Error("rewritten writeback.pub does not match writeback.key")
	}

	// A .pub that belongs to another key is an error, not silently kept or replaced.
	copyFile(t, identity.PublicKeyFile(dir, "operator"), identity.PublicKeyFile(dir, "coordinator"))
	if _, err := identity.GenerateKeys(dir, svcs, false); err == nil || !strings.Contains(err.Error(), "coordinator.pub does not match") {
		t.Errorf("mismatched .pub: %v", err)
	}
	// --force replaces both.
	res, err = identity.GenerateKeys(dir, svcs, true)
	if err != nil || len(res.Written) != 4 {
		t.Fatalf("force: %v, %v", res, err)
	}
	if must(identity.LoadPrivateKey(identity.KeyFile(dir, "coordinator"))).Equal(key) {
		t.Error("--force kept the old coordinator key")
	}
	if _, err := identity.GenerateKeys(dir, []string{"Bad Name"}, false); err == nil || !strings.Contains(err.Error(), `"Bad Name" is not a service name`) {
		t.Errorf("bad service: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func pemFile(t *testing.T, dir, name, typ string, der []byte, mode fs.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

func TestLoadPrivateKeyErrors(t *testing.T) {
	dir := t.TempDir()
	good := must(x509.MarshalPKCS8PrivateKey(seededKey(1)))
	ec := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	hexKey := filepath.Join(dir, "old.key")
	os.WriteFile(hexKey, []byte(hex.EncodeToString(make([]byte, 32))), 0o600)
	for _, tt := range []struct {
		name, path, msg string
	}{
		{"missing", filepath.Join(dir, "none.key"), "no such file"},
		{"a directory", dir, "is not a regular file"},
		{"group-readable", pemFile(t, dir, "open.key", "PRIVATE KEY", good, 0o640), "has mode 0640: a private key must not be readable or writable by group or others (chmod 600 it)"},
		{"world-readable", pemFile(t, dir, "world.key", "PRIVATE KEY", good, 0o604), "mode 0604"},
		{"old shared hex key", hexKey, "is not a PEM private key (a shared hst1 key from an older version? make one key per service with `handoff keys`)"},
		{"a public key", pemFile(t, dir, "pub.key", "PUBLIC KEY", must(x509.MarshalPKIXPublicKey(seededKey(1).Public())), 0o600), `holds a PEM "PUBLIC KEY" block, want "PRIVATE KEY"`},
		{"an ECDSA key", pemFile(t, dir, "ec.key", "PRIVATE KEY", must(x509.MarshalPKCS8PrivateKey(ec)), 0o600), "holds a ecdsa.PrivateKey key, want Ed25519"},
		{"garbage DER", pemFile(t, dir, "junk.key", "PRIVATE KEY", []byte("junk"), 0o600), "junk.key:"},
	} {
		if _, err := identity.LoadPrivateKey(tt.path); err == nil || !strings.Contains(err.Error(), tt.msg) || (tt.path != dir && !strings.Contains(err.Error(), tt.path)) {
			t.Errorf("%s: err %v, want it to name %s and say %q", tt.name, err, tt.path, tt.msg)
		}
	}
	if k, err := identity.LoadPrivateKey(pemFile(t, dir, "ok.key", "PRIVATE KEY", good, 0o600)); err != nil || !k.Equal(seededKey(1)) {
		t.Errorf("good key: %v", err)
	}
}

func TestLoadPublicKeysErrors(t *testing.T) {
	pub := must(x509.MarshalPKIXPublicKey(seededKey(1).Public()))
	ec := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	folder := func(files map[string][]byte) string {
		dir := t.TempDir()
		for name, der := range files {
			typ := "PUBLIC KEY"
			if other, ok := strings.CutPrefix(string(der), "type:"); ok {
				typ, der = other, pub
			}
			pemFile(t, dir, name, typ, der, 0o644)
		}
		return dir
	}
	for _, tt := range []struct {
		name, dir, msg string
	}{
		{"missing", filepath.Join(t.TempDir(), "none"), "no such file"},
		{"empty", folder(nil), "holds no <service>.pub files"},
		{"only other files", folder(map[string][]byte{"README": pub, ".hidden.pub": pub}), "holds no <service>.pub files"},
		{"a private key beside", folder(map[string][]byte{"coordinator.pub": pub, "coordinator.key": pub}), "coordinator.key is a private key: the public-keys folder must hold only <service>.pub files"},
		{"a private key inside a .pub", folder(map[string][]byte{"coordinator.pub": []byte("type:PRIVATE KEY")}), "coordinator.pub holds a private key: a verifier must hold only public keys"},
		{"bad service name", folder(map[string][]byte{"Coordinator.pub": pub}), `"Coordinator" is not a service name`},
		{"an ECDSA key", folder(map[string][]byte{"coordinator.pub": must(x509.MarshalPKIXPublicKey(&ec.PublicKey))}), "coordinator.pub holds a ecdsa.PublicKey key, want Ed25519"},
		{"a certificate", folder(map[string][]byte{"coordinator.pub": []byte("type:CERTIFICATE")}), `holds a PEM "CERTIFICATE" block, want "PUBLIC KEY"`},
		{"garbage DER", folder(map[string][]byte{"coordinator.pub": []byte("junk")}), "coordinator.pub:"},
	} {
		if _, err := identity.LoadPublicKeys(tt.dir); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.msg)
		}
	}
	// Not PEM at all.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "coordinator.pub"), []byte("ssh-ed25519 AAAA"), 0o644)
	if _, err := identity.LoadPublicKeys(dir); err == nil || !strings.Contains(err.Error(), "is not a PEM public key") {
		t.Errorf("not PEM: %v", err)
	}
	// Hidden entries and other files are skipped; .pub files load by service name.
	dir = folder(map[string][]byte{"coordinator.pub": pub, "README.md": []byte("x"), ".coordinator.pub.tmp1": []byte("x")})
	os.Mkdir(filepath.Join(dir, "..data"), 0o755)
	keys, err := identity.LoadPublicKeys(dir)
	if err != nil || len(keys) != 1 || !keys["coordinator"].Equal(seededKey(1).Public()) {
		t.Errorf("keys %v, %v", keys, err)
	}
}
