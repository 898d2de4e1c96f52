package certs_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/certs"
)

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: no CERTIFICATE block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

func TestGenerateFilesAndPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	services := []string{"coordinator", "writeback", "coordinator"} // a repeat is made once
	if err := certs.Generate(dir, services, 48*time.Hour); err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{
		"ca.pem": 0o644, "ca-key.pem": 0o600,
		"coordinator.pem": 0o644, "coordinator-key.pem": 0o600,
		"writeback.pem": 0o644, "writeback-key.pem": 0o600,
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		mode, ok := want[e.Name()]
		if !ok {
			t.Errorf("unexpected file %s", e.Name())
			continue
		}
		if got := info.Mode().Perm(); got != mode {
			t.Errorf("%s: mode %o, want %o", e.Name(), got, mode)
		}
	}
	if len(names) != len(want) {
		t.Errorf("files %v, want %d files", names, len(want))
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("dir mode: %v %v, want 0700", info.Mode().Perm(), err)
	}
}

func TestServiceCertificateContents(t *testing.T) {
	dir := t.TempDir()
	const validity = 72 * time.Hour
	if err := certs.Generate(dir, []string{"agentrunner"}, validity); err != nil {
		t.Fatal(err)
	}
	ca := parseCert(t, filepath.Join(dir, "ca.pem"))
	if !ca.IsCA || !ca.BasicConstraintsValid || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("ca.pem is not a signing CA: IsCA=%v KeyUsage=%v", ca.IsCA, ca.KeyUsage)
	}
	c := parseCert(t, filepath.Join(dir, "agentrunner.pem"))

	if c.Subject.CommonName != "agentrunner" {
		t.Errorf("CN %q", c.Subject.CommonName)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://handoff.local/agentrunner" {
		t.Errorf("URI SANs %v", c.URIs)
	}
	if !slices.Equal(c.DNSNames, []string{"localhost", "agentrunner"}) {
		t.Errorf("DNS SANs %v", c.DNSNames)
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	if !slices.Equal(ips, []string{"127.0.0.1", "::1"}) {
		t.Errorf("IP SANs %v", ips)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage %v", c.ExtKeyUsage)
	}
	if c.IsCA {
		t.Error("service certificate is a CA")
	}
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", c.PublicKey)
	}
	if d := time.Until(c.NotAfter); d < validity-time.Minute || d > validity+time.Minute {
		t.Errorf("NotAfter in %s, want about %s", d, validity)
	}
	if time.Now().Before(c.NotBefore) {
		t.Errorf("NotBefore %s is in the future", c.NotBefore)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, host := range []string{"localhost", "agentrunner", "127.0.0.1", "::1"} {
			if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("verify for %s as %v: %v", host, usage, err)
			}
		}
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "writeback"}); err == nil {
		t.Error("agentrunner's certificate verified for host writeback")
	}
}

func TestGenerateKeepsExistingFilesUnlessForced(t *testing.T) {
	dir := t.TempDir()
	if err := certs.Generate(dir, []string{"coordinator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	before := readAll(t, dir)

	// Again without force: nothing changes, and the run says what it kept.
	res, err := certs.GenerateWith(certs.Options{Dir: dir, Services: []string{"coordinator"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Written) != 0 || len(res.Kept) != 4 {
		t.Errorf("second run: written %v kept %v", res.Written, res.Kept)
	}
	if after := readAll(t, dir); !mapsEqual(before, after) {
		t.Error("second run without force changed files")
	}

	// A new service is signed by the existing CA; the old files stay as they were.
	res, err = certs.GenerateWith(certs.Options{Dir: dir, Services: []string{"coordinator", "writeback"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "writeback.pem"), filepath.Join(dir, "writeback-key.pem")}; !slices.Equal(res.Written, want) {
		t.Errorf("written %v, want %v", res.Written, want)
	}
	after := readAll(t, dir)
	for name, b := range before {
		if !bytes.Equal(after[name], b) {
			t.Errorf("%s changed", name)
		}
	}
	ca := parseCert(t, filepath.Join(dir, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := parseCert(t, filepath.Join(dir, "writeback.pem")).Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		t.Errorf("new service not signed by the existing CA: %v", err)
	}

	// With force: a new CA and new certificates; writeback, not asked for, is stale.
	res, err = certs.GenerateWith(certs.Options{Dir: dir, Services: []string{"coordinator"}, Validity: time.Hour, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Written) != 4 || len(res.Kept) != 0 {
		t.Errorf("forced run: written %v kept %v", res.Written, res.Kept)
	}
	if want := []string{filepath.Join(dir, "writeback.pem")}; !slices.Equal(res.Stale, want) {
		t.Errorf("stale %v, want %v", res.Stale, want)
	}
	forced := readAll(t, dir)
	for _, name := range []string{"ca.pem", "ca-key.pem", "coordinator.pem", "coordinator-key.pem"} {
		if bytes.Equal(forced[name], before[name]) {
			t.Errorf("%s not replaced by force", name)
		}
	}
	if _, err := certs.ServerTLS(dir, "coordinator"); err != nil {
		t.Errorf("after force: %v", err)
	}
	if _, err := certs.ServerTLS(dir, "writeback"); err == nil || !strings.Contains(err.Error(), "does not verify against") {
		t.Errorf("stale writeback: err %v", err)
	}
}

func mapsEqual(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(b[k], v) {
			return false
		}
	}
	return true
}

func TestGenerateRefusesInconsistentFiles(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		want    string
	}{
		{"key without cert", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "coordinator.pem"))
		}, "coordinator-key.pem exists but " + "DIR/coordinator.pem does not"},
		{"CA key without CA", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "ca.pem"))
		}, "ca-key.pem exists but DIR/ca.pem does not"},
		{"CA gone, service kept", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "ca.pem"))
			os.Remove(filepath.Join(dir, "ca-key.pem"))
		}, "signed by a CA that is gone"},
		{"new service without CA key", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "ca-key.pem"))
		}, "ca-key.pem is missing: cannot sign certificates for [writeback]"},
		{"service from another CA", func(t *testing.T, dir string) {
			other := t.TempDir()
			if err := certs.Generate(other, []string{"coordinator"}, time.Hour); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"coordinator.pem", "coordinator-key.pem"} {
				b, _ := os.ReadFile(filepath.Join(other, f))
				os.WriteFile(filepath.Join(dir, f), b, 0o600)
			}
		}, "coordinator.pem does not verify against DIR/ca.pem"},
		{"garbage CA", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("nope"), 0o644)
		}, "ca.pem holds no PEM CERTIFICATE block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := certs.Generate(dir, []string{"coordinator"}, time.Hour); err != nil {
				t.Fatal(err)
			}
			tt.prepare(t, dir)
			before := readAll(t, dir)
			err := certs.Generate(dir, []string{"coordinator", "writeback"}, time.Hour)
			if want := strings.ReplaceAll(tt.want, "DIR", dir); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("err %v, want it to contain %q", err, want)
			}
			if after := readAll(t, dir); !mapsEqual(before, after) {
				t.Error("a failed run changed files")
			}
			// Force always starts over.
			if _, err := certs.GenerateWith(certs.Options{Dir: dir, Services: []string{"coordinator", "writeback"}, Validity: time.Hour, Force: true}); err != nil {
				t.Fatalf("force: %v", err)
			}
			if _, err := certs.ClientTLS(dir, "writeback"); err != nil {
				t.Errorf("after force: %v", err)
			}
		})
	}
}

func TestGenerateArguments(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		services []string
		validity time.Duration
		want     string
	}{
		{"no services", nil, time.Hour, "no service given"},
		{"zero validity", []string{"a"}, 0, "validity must be positive"},
		{"upper case", []string{"Writeback"}, time.Hour, `service name "Writeback"`},
		{"dot", []string{"a.b"}, time.Hour, `service name "a.b"`},
		{"slash", []string{"../x"}, time.Hour, `service name "../x"`},
		{"empty", []string{""}, time.Hour, `service name ""`},
		{"ca", []string{"ca"}, time.Hour, `"ca" is taken`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := certs.Generate(dir, tt.services, tt.validity)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %q", err, tt.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bad arguments wrote %d files", len(entries))
	}
}

func TestTLSConfigErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	if err := certs.Generate(dir, []string{"coordinator", "writeback"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	wbKey, _ := os.ReadFile(filepath.Join(dir, "writeback-key.pem"))
	tests := []struct {
		name    string
		prepare func(dir string)
		svc     string
		want    string
	}{
		{"unknown service", func(string) {}, "operator", "DIR/operator.pem is missing"},
		{"missing CA", func(d string) { os.Remove(filepath.Join(d, "ca.pem")) }, "coordinator", "DIR/ca.pem is missing"},
		{"missing key", func(d string) { os.Remove(filepath.Join(d, "coordinator-key.pem")) }, "coordinator", "DIR/coordinator-key.pem is missing"},
		{"wrong key", func(d string) { os.WriteFile(filepath.Join(d, "coordinator-key.pem"), wbKey, 0o600) }, "coordinator", "DIR/coordinator.pem with DIR/coordinator-key.pem"},
		{"bad name", func(string) {}, "../etc/passwd", "service name"},
	}
	for _, tt := range tests {
		for _, fn := range []struct {
			name string
			f    func(dir, svc string) (*tls.Config, error)
		}{{"ServerTLS", certs.ServerTLS}, {"ClientTLS", certs.ClientTLS}} {
			t.Run(tt.name+"/"+fn.name, func(t *testing.T) {
				d := t.TempDir()
				for name, b := range readAll(t, dir) {
					os.WriteFile(filepath.Join(d, name), b, 0o600)
				}
				tt.prepare(d)
				_, err := fn.f(d, tt.svc)
				if want := strings.ReplaceAll(tt.want, "DIR", d); err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("err %v, want %q", err, want)
				}
			})
		}
	}
}

func TestTLSConfigsHandshake(t *testing.T) {
	dir, otherDir := t.TempDir(), t.TempDir()
	if err := certs.Generate(dir, []string{"writeback", "coordinator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := certs.Generate(otherDir, []string{"coordinator"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	srvCfg, err := certs.ServerTLS(dir, "writeback")
	if err != nil {
		t.Fatal(err)
	}
	if srvCfg.ClientAuth != tls.RequireAndVerifyClientCert || srvCfg.MinVersion != tls.VersionTLS13 {
		t.Fatalf("server config: ClientAuth %v MinVersion %x", srvCfg.ClientAuth, srvCfg.MinVersion)
	}
	good, err := certs.ClientTLS(dir, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := certs.ClientTLS(otherDir, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	noCert := good.Clone()
	noCert.Certificates = nil
	// The foreign client trusts our CA but presents a certificate from its own.
	foreign.RootCAs = good.RootCAs

	tests := []struct {
		name   string
		client *tls.Config
		host   string
		ok     bool
	}{
		{"same CA", good, "127.0.0.1", true},
		{"by service name", good, "writeback", true},
		{"wrong host", good, "coordinator", false},
		{"no client certificate", noCert, "127.0.0.1", false},
		{"client from another CA", foreign, "127.0.0.1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, s := net.Pipe()
			defer c.Close()
			defer s.Close()
			srvErr := make(chan error, 1)
			go func() {
				ts := tls.Server(s, srvCfg)
				err := ts.Handshake()
				if err == nil {
					// TLS 1.3: the client learns of a refused certificate on its first read.
					_, err = ts.Write([]byte("x"))
				}
				srvErr <- err
				s.Close()
			}()
			cfg := tt.client.Clone()
			cfg.ServerName = tt.host
			tc := tls.Client(c, cfg)
			err := tc.Handshake()
			if err == nil {
				_, err = tc.Read(make([]byte, 1))
			}
			c.Close()
			sErr := <-srvErr
			if tt.ok && (err != nil || sErr != nil) {
				t.Fatalf("client %v, server %v", err, sErr)
			}
			if !tt.ok && err == nil && sErr == nil {
				t.Fatal("handshake succeeded")
			}
		})
	}
}
