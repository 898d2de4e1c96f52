package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/interceptor/identity"
	"github.com/handoffhq/handoff/internal/rpc"
)

func keysRun(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = runKeys(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestKeysExitCodesAndOutput(t *testing.T) {
	base := t.TempDir()
	aFile := filepath.Join(base, "file")
	if err := os.WriteFile(aFile, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(base, "d")
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{name: "help", args: []string{"-h"}, code: 0, stdout: []string{"Usage: handoff keys", "--token-key-file", "--token-public-keys"}},
		{name: "bad flag", args: []string{"--nope"}, code: 2, stderr: "flag provided but not defined"},
		{name: "argument", args: []string{"--dir", base, "extra"}, code: 2, stderr: `unexpected argument "extra"`},
		{name: "bad service", args: []string{"--dir", base, "--services", "coordinator,Write Back"}, code: 2, stderr: `--services: service name "Write Back"`},
		{name: "no service", args: []string{"--dir", base, "--services", " , "}, code: 2, stderr: "names no service"},
		{name: "empty dir", args: []string{"--dir", ""}, code: 2, stderr: "--dir is empty"},
		{name: "dir is a file", args: []string{"--dir", aFile, "--services", "coordinator"}, code: 1, stderr: "handoff keys: "},
		{name: "defaults", args: []string{"--dir", d}, code: 0, stdout: []string{
			"wrote " + filepath.Join(d, "coordinator.key") + "  (private, 0600)\n",
			"wrote " + filepath.Join(d, "public", "coordinator.pub") + "\n",
			"wrote " + filepath.Join(d, "operator.key"),
			"coordinator --plaintext-loopback --token-key-file " + filepath.Join(d, "coordinator.key") + " --token-public-keys " + filepath.Join(d, "public"),
			"writeback   --plaintext-loopback --token-key-file " + filepath.Join(d, "writeback.key"),
		}},
		{name: "again keeps", args: []string{"--dir", d}, code: 0, stdout: []string{"kept  " + filepath.Join(d, "coordinator.key") + "  (exists; --force replaces it)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := keysRun(tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr %q lacks %q", stderr, tt.stderr)
			}
		})
	}

	// The files are what the services' flags take: each service starts with its own key
	// and the public folder, and refuses another's key.
	pub := filepath.Join(d, identity.PublicDir)
	for _, svc := range []string{"coordinator", "agentrunner", "writeback"} {
		sec := rpc.Security{PlaintextLoopback: true, TokenKeyFile: identity.KeyFile(d, svc), TokenPublicKeys: pub}
		if _, _, err := sec.Server(svc, "127.0.0.1:0"); err != nil {
			t.Errorf("%s: Server: %v", svc, err)
		}
	}
	sec := rpc.Security{PlaintextLoopback: true, TokenKeyFile: identity.KeyFile(d, "writeback"), TokenPublicKeys: pub}
	if _, err := sec.Client("coordinator"); err == nil || !strings.Contains(err.Error(), "is not coordinator's key") {
		t.Errorf("writeback's key as coordinator: %v", err)
	}
}
