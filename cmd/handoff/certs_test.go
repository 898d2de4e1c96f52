package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/certs"
)

func certsRun(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = runCerts(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCertsExitCodesAndOutput(t *testing.T) {
	base := t.TempDir()
	aFile := filepath.Join(base, "file")
	if err := os.WriteFile(aFile, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{name: "help", args: []string{"-h"}, code: 0, stdout: []string{"Usage: handoff certs"}},
		{name: "bad flag", args: []string{"--nope"}, code: 2, stderr: "flag provided but not defined"},
		{name: "argument", args: []string{"--dir", base, "extra"}, code: 2, stderr: `unexpected argument "extra"`},
		{name: "zero days", args: []string{"--dir", base, "--days", "0"}, code: 2, stderr: "--days 0: want 1 to 3650"},
		{name: "days not a number", args: []string{"--days", "soon"}, code: 2, stderr: "invalid value"},
		{name: "bad service", args: []string{"--dir", base, "--services", "coordinator,Write Back"}, code: 2, stderr: `service name "Write Back"`},
		{name: "no service", args: []string{"--dir", base, "--services", " , "}, code: 2, stderr: "names no service"},
		{name: "empty dir", args: []string{"--dir", ""}, code: 2, stderr: "--dir is empty"},
		{name: "dir is a file", args: []string{"--dir", aFile, "--services", "coordinator"}, code: 1, stderr: "handoff certs: "},
		{name: "defaults", args: []string{"--dir", filepath.Join(base, "d")}, code: 0, stdout: []string{
			"wrote " + filepath.Join(base, "d", "ca.pem") + "\n",
			"wrote " + filepath.Join(base, "d", "ca-key.pem") + "  (private, 0600)\n",
			"wrote " + filepath.Join(base, "d", "coordinator.pem"),
			"wrote " + filepath.Join(base, "d", "operator-key.pem"),
			"valid for 30 days",
			"spiffe://handoff.local/<service>",
			"grpcurl -cacert " + filepath.Join(base, "d", "ca.pem") + " -cert " + filepath.Join(base, "d", "operator.pem"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := certsRun(tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			rest := stdout
			for _, want := range tt.stdout {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Fatalf("stdout lacks %q (in order)\n%s", want, stdout)
				}
				rest = rest[i+len(want):]
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr %q lacks %q", stderr, tt.stderr)
			}
		})
	}
}

func TestCertsKeepsThenForces(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if code, _, stderr := certsRun("--dir", dir, "--services", "coordinator,writeback", "--days", "2"); code != 0 {
		t.Fatalf("first run: %d %s", code, stderr)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "coordinator.pem", "coordinator-key.pem", "writeback.pem", "writeback-key.pem"} {
		info, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o644)
		if strings.HasSuffix(f, "-key.pem") {
			want = 0o600
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s: mode %o, want %o", f, info.Mode().Perm(), want)
		}
	}
	cfg, err := certs.ClientTLS(dir, "coordinator")
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(cfg.Certificates[0].Leaf.NotAfter); d < 47*time.Hour || d > 49*time.Hour {
		t.Errorf("--days 2 gave a certificate valid for %s", d)
	}
	ca, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))

	// Again: kept, and a new service joins the same CA.
	code, stdout, stderr := certsRun("--dir", dir, "--services", "coordinator,writeback,operator")
	if code != 0 {
		t.Fatalf("second run: %d %s", code, stderr)
	}
	for _, want := range []string{"kept  " + filepath.Join(dir, "ca.pem"), "kept  " + filepath.Join(dir, "coordinator.pem"), "wrote " + filepath.Join(dir, "operator.pem")} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q\n%s", want, stdout)
		}
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); !bytes.Equal(now, ca) {
		t.Error("ca.pem changed without --force")
	}

	// A broken pair stops the run with 1 and names the file.
	if err := os.Remove(filepath.Join(dir, "writeback-key.pem")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = certsRun("--dir", dir, "--services", "coordinator,writeback")
	if code != 1 || !strings.Contains(stderr, filepath.Join(dir, "writeback.pem")+" exists but "+filepath.Join(dir, "writeback-key.pem")+" does not") {
		t.Fatalf("broken pair: exit %d, stderr %q", code, stderr)
	}

	// --force: a new CA; operator, not named, is reported stale.
	code, stdout, stderr = certsRun("--dir", dir, "--services", "coordinator,writeback", "--force")
	if code != 0 {
		t.Fatalf("forced run: %d %s", code, stderr)
	}
	if strings.Contains(stdout, "kept") || !strings.Contains(stderr, filepath.Join(dir, "operator.pem")+" was signed by the replaced CA") {
		t.Errorf("forced run: stdout %q stderr %q", stdout, stderr)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); bytes.Equal(now, ca) {
		t.Error("--force kept ca.pem")
	}
}

func TestCertsViaRun(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"certs", "-h"}, nil, &out, &errOut); code != 0 || !strings.Contains(out.String(), "Usage: handoff certs") {
		t.Errorf("run certs -h: %d %q %q", code, out.String(), errOut.String())
	}
}
