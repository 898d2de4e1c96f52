package contract

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBufBreakingBites proves the CI breaking check (scripts/buf-breaking.sh, FILE rules) would
// stop an incompatible edit of handoff.v1: it breaks a copy of proto/ on purpose and expects
// buf to refuse it, and expects the untouched copy to pass, so the test itself can fail.
func TestBufBreakingBites(t *testing.T) {
	root := repoRoot(t)
	buf := filepath.Join(root, "tools", "node_modules", ".bin", "buf")
	validateProto := filepath.Join(root, ".build", "protovalidate", "buf", "validate", "validate.proto")
	for _, need := range []string{buf, validateProto} {
		if _, err := os.Stat(need); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing in CI: the pipeline must run `make tools protodeps` first", need)
			}
			t.Skipf("%s is missing; run `make tools protodeps` to enable this test", need)
		}
	}
	if testing.Short() {
		t.Skip("runs buf; skipped with -short")
	}

	base := copyTree(t, root)
	image := filepath.Join(t.TempDir(), "base.binpb")
	if out, err := runBuf(buf, base, "build", base, "-o", image); err != nil {
		t.Fatalf("buf build of the unchanged copy failed: %v\n%s", err, out)
	}

	// Both sides are compared as images. `buf breaking --against IMAGE` with the workspace
	// directory as input does not work here: the workspace has two modules (proto and
	// .build/protovalidate) and buf refuses with "input contained 2 images, whereas against
	// contained 1 images". buf reads the breaking config (FILE rules) from the buf.yaml in its
	// working directory, which is the copy's own.
	t.Run("unchanged passes", func(t *testing.T) {
		if out, err := runBuf(buf, base, "breaking", image, "--against", image); err != nil {
			t.Fatalf("buf breaking failed on an unchanged copy: %v\n%s", err, out)
		}
	})

	// The versioning table's incompatible rows, inside one version (README "Versions on the wire"): a
	// rename, a changed type, and removing a field so its number could carry a new meaning.
	for _, tc := range []struct {
		name     string
		old, new string
		field    string // what buf's complaint must name
	}{
		{"rename job_id", "string job_id = 2 [", "string ticket_id = 2 [", "job_id"},
		{"renumber job_id", "string job_id = 2 [", "string job_id = 99 [", "job_id"},
		{"change the type of goal", "string goal = 4 [", "bytes goal = 4 [", "goal"},
		{"delete next_hint to reuse 13", "string next_hint = 13 [(buf.validate.field).string.max_len = 1000];", "", "next_hint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := copyTree(t, root)
			file := filepath.Join(changed, "proto", "handoff", "v1", "handoff.proto")
			editInMessage(t, file, "message HandoffPackage {", tc.old, tc.new)
			changedImage := filepath.Join(t.TempDir(), "changed.binpb")
			if out, err := runBuf(buf, changed, "build", changed, "-o", changedImage); err != nil {
				t.Fatalf("buf build of the changed copy failed: %v\n%s", err, out)
			}
			out, err := runBuf(buf, changed, "breaking", changedImage, "--against", image)
			if err == nil {
				t.Fatalf("buf breaking accepted %s:\n%s", tc.name, out)
			}
			if _, ok := err.(*exec.ExitError); !ok {
				t.Fatalf("buf did not run: %v", err)
			}
			if !strings.Contains(out, tc.field) || !strings.Contains(out, "HandoffPackage") {
				t.Fatalf("buf breaking failed but does not name HandoffPackage.%s:\n%s", tc.field, out)
			}
			t.Logf("buf breaking says:\n%s", out)
		})
	}
}

func runBuf(buf, dir string, args ...string) (string, error) {
	cmd := exec.Command(buf, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BUF_CACHE_DIR="+filepath.Join(dir, ".bufcache"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// copyTree copies what buf needs (proto/, buf.yaml, .build/protovalidate) into a temp dir.
func copyTree(t *testing.T, root string) string {
	t.Helper()
	dst := t.TempDir()
	for _, rel := range []string{"proto", "buf.yaml", filepath.Join(".build", "protovalidate")} {
		src := filepath.Join(root, rel)
		err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			r, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			target := filepath.Join(dst, r)
			if d.IsDir() {
				return os.MkdirAll(target, 0o755)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// editInMessage replaces the first occurrence of old after the line that opens a message.
func editInMessage(t *testing.T, file, message, old, new string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	at := strings.Index(s, message)
	if at < 0 {
		t.Fatalf("%s: %q not found", file, message)
	}
	i := strings.Index(s[at:], old)
	if i < 0 {
		t.Fatalf("%s: %q not found in %s", file, old, message)
	}
	i += at
	s = s[:i] + new + s[i+len(old):]
	if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
