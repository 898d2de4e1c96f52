package artifact_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/artifact"
)

var note = artifact.Ref{JobID: "tkt_1", Stage: "draft", Type: "note", SchemaVersion: "note.v1", MediaType: "text/plain"}

func newFiles(t *testing.T) *artifact.Files {
	t.Helper()
	f, err := artifact.NewFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func fileURI(path string) string {
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(path)}).String()
}

// secret is a file outside the artifact root that no artifact may reach.
func secret(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("root:x:0:0"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantRefused checks that err refuses the artifact as not a regular file, says what it is,
// and that no content came back.
func wantRefused(t *testing.T, data []byte, err error, what string) {
	t.Helper()
	if !errors.Is(err, artifact.ErrNotRegular) {
		t.Fatalf("Get = %q, %v; want an error wrapping ErrNotRegular", data, err)
	}
	if data != nil {
		t.Fatalf("Get returned %q with its error", data)
	}
	if !strings.Contains(err.Error(), what) {
		t.Fatalf("error %q does not say %q", err, what)
	}
}

// TestGetRefusesLinks: a symbolic link in the artifacts folder is refused, not followed,
// whether it is the file itself or a folder on the way, and whether it points outside the
// root (to a secret) or at a real artifact inside it (which os.Root alone would follow).
func TestGetRefusesLinks(t *testing.T) {
	ctx := context.Background()
	f := newFiles(t)
	real, err := f.Put(ctx, note, []byte("real artifact"))
	if err != nil {
		t.Fatal(err)
	}
	realPath := filepath.Join(f.Root(), "tkt_1", "draft-r0", "note.txt")
	outside := secret(t)
	outsideDir := filepath.Dir(outside)

	mustLink := func(target, name string) string {
		t.Helper()
		p := filepath.Join(f.Root(), name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, uri, what string
	}{
		{"file links outside", fileURI(mustLink(outside, "tkt_2/draft-r0/note.txt")), `"tkt_2/draft-r0/note.txt" is a symbolic link`},
		{"file links inside", fileURI(mustLink(realPath, "tkt_3/draft-r0/note.txt")), `"tkt_3/draft-r0/note.txt" is a symbolic link`},
		{"relative link inside", fileURI(mustLink("../../tkt_1/draft-r0/note.txt", "tkt_4/draft-r0/note.txt")), `"tkt_4/draft-r0/note.txt" is a symbolic link`},
		{"folder links outside", fileURI(filepath.Join(mustLink(outsideDir, "tkt_5/draft-r0"), "secret")), `"tkt_5/draft-r0" is a symbolic link`},
		{"folder links inside", fileURI(filepath.Join(mustLink(filepath.Join(f.Root(), "tkt_1"), "tkt_6"), "draft-r0", "note.txt")), `"tkt_6" is a symbolic link`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data, err := f.Get(ctx, c.uri)
			wantRefused(t, data, err, c.what)
		})
	}
	// The real artifact behind the links still reads.
	if got, err := f.Get(ctx, real.GetUri()); err != nil || string(got) != "real artifact" {
		t.Fatalf("Get(real) = %q, %v", got, err)
	}
}

// TestGetRefusesOtherKinds: a folder or a socket at an artifact's URI is refused by what it
// is.
func TestGetRefusesOtherKinds(t *testing.T) {
	ctx := context.Background()
	f := newFiles(t)
	if _, err := f.Put(ctx, note, []byte("x")); err != nil {
		t.Fatal(err)
	}
	data, err := f.Get(ctx, fileURI(filepath.Join(f.Root(), "tkt_1", "draft-r0")))
	wantRefused(t, data, err, `"tkt_1/draft-r0" is a folder`)

	sock := filepath.Join(f.Root(), "tkt_1", "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	data, err = f.Get(ctx, fileURI(sock))
	wantRefused(t, data, err, `"tkt_1/s" is a socket`)
}

// TestPutDoesNotWriteThroughLinks: a link already at the artifact's name is replaced, not
// written through; a linked folder on the way is refused and nothing is written where it
// points.
func TestPutDoesNotWriteThroughLinks(t *testing.T) {
	ctx := context.Background()
	f := newFiles(t)
	outside := secret(t)

	name := filepath.Join(f.Root(), "tkt_1", "draft-r0", "note.txt")
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, name); err != nil {
		t.Fatal(err)
	}
	a, err := f.Put(ctx, note, []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "root:x:0:0" {
		t.Fatalf("the link's target now holds %q", b)
	}
	if fi, err := os.Lstat(name); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("artifact name after Put: %v, %v; want a regular file", fi, err)
	}
	if got, err := f.Get(ctx, a.GetUri()); err != nil || string(got) != "new" {
		t.Fatalf("Get = %q, %v", got, err)
	}

	// The job folder links to a folder outside the root.
	outDir := t.TempDir()
	if err := os.Symlink(outDir, filepath.Join(f.Root(), "tkt_2")); err != nil {
		t.Fatal(err)
	}
	ref := note
	ref.JobID = "tkt_2"
	_, err = f.Put(ctx, ref, []byte("escaped"))
	if !errors.Is(err, artifact.ErrNotRegular) || !strings.Contains(err.Error(), `"tkt_2" is a symbolic link`) {
		t.Fatalf("Put through a linked job folder = %v; want it refused naming tkt_2", err)
	}
	if strings.Contains(err.Error(), f.Root()) {
		t.Fatalf("Put's error %q names the artifact root", err)
	}
	if ents, _ := os.ReadDir(outDir); len(ents) != 0 {
		t.Fatalf("Put wrote %d entries where the link points", len(ents))
	}
}

// TestErrorsDoNotNameTheRoot: errors reach callers, so they name the URI the caller sent and
// paths relative to the root, never the root's own absolute path.
func TestErrorsDoNotNameTheRoot(t *testing.T) {
	ctx := context.Background()
	f := newFiles(t)
	for _, uri := range []string{"file:///etc/passwd", "file://" + filepath.ToSlash(f.Root()) + "/../x"} {
		_, err := f.Get(ctx, uri)
		if err == nil || !strings.Contains(err.Error(), "outside the artifact root") {
			t.Fatalf("Get(%s) = %v; want outside the artifact root", uri, err)
		}
		if strings.Contains(strings.ReplaceAll(err.Error(), uri, ""), f.Root()) {
			t.Fatalf("Get(%s) error %q names the artifact root beyond the URI sent", uri, err)
		}
	}
	uri := fileURI(filepath.Join(f.Root(), "tkt_9", "draft-r0", "gone.txt"))
	_, err := f.Get(ctx, uri)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), `"tkt_9" does not exist`) {
		t.Fatalf("Get(missing) = %v; want ErrNotExist naming tkt_9", err)
	}
	if strings.Contains(strings.ReplaceAll(err.Error(), uri, ""), f.Root()) {
		t.Fatalf("Get(missing) error %q names the artifact root beyond the URI sent", err)
	}
}

// A hard link under the root is a regular file whose bytes are another's: refused, as the
// attack that read a file from outside the root through one.
func TestGetRefusesHardLinks(t *testing.T) {
	f := newFiles(t)
	sec := secret(t)
	dir := filepath.Join(f.Root(), "tkt_1", "submit-r0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "raw.json")
	if err := os.Link(sec, link); err != nil {
		t.Skipf("no hard links across these folders here: %v", err)
	}
	_, err := f.Get(context.Background(), fileURI(link))
	if !errors.Is(err, artifact.ErrNotRegular) || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("Get of a hard link = %v; want ErrNotRegular naming the links", err)
	}
}

// A digest that does not match says so without telling what the bytes' digest is: it
// would hand a caller who guessed a path the digest to pass the check with.
func TestDigestMismatchDoesNotTellTheDigest(t *testing.T) {
	f := newFiles(t)
	a, err := f.Put(context.Background(), note, []byte("the real content"))
	if err != nil {
		t.Fatal(err)
	}
	real := a.GetSha256()
	a.Sha256 = strings.Repeat("0", 64)
	err = artifact.Verify(a, []byte("the real content"))
	if err == nil || strings.Contains(err.Error(), real) {
		t.Fatalf("Verify with a wrong digest = %v; want a refusal that does not contain %s", err, real)
	}
}
