// Package artifact stores what stages produce, so packages can carry a URI instead of the
// payload. The default store is a folder on local disk (file:// URIs); every stage of a
// deployment must see the same folder (one machine, or a shared volume).
package artifact

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// MaxBytes caps one artifact. Artifacts are documents (a summary, retrieved chunks), not
// data dumps; a bigger one is refused rather than silently truncated.
const MaxBytes = 4 << 20

// ErrTooLarge is returned for artifacts over MaxBytes.
var ErrTooLarge = errors.New("artifact larger than 4 MiB")

// Ref names an artifact by what produced it. Round is the judge round the stage ran in, so
// a revision never overwrites the draft the judge failed.
type Ref struct {
	JobID, Stage string
	Round        uint32
	// Returns is how many times a person had sent the job back to a stage
	// (package.operator_returns), so a stage re-run on a person's word never overwrites the
	// run it replaces, also within one judge round.
	Returns uint32
	// Visit is how many times the job came to the stage before in this round and return
	// (package.visit): a stage a route sends the job back to never overwrites its earlier run.
	Visit uint32
	// Type and SchemaVersion become the Artifact's type and schema_version.
	Type, SchemaVersion string
	// MediaType of the bytes ("application/json", "text/markdown").
	MediaType string
}

// Store reads and writes artifacts by URI.
type Store interface {
	// Put stores data and returns the Artifact that points at it.
	Put(ctx context.Context, ref Ref, data []byte) (*handoffv1.Artifact, error)
	// Get returns the bytes behind an artifact URI.
	Get(ctx context.Context, uri string) ([]byte, error)
}

// Files stores artifacts under a root folder. Every open goes through an os.Root on that
// folder and walks the path one name at a time without following links: an artifact is a
// regular file in real folders under the root, never a symbolic link, FIFO, device or
// socket placed there (a link to /etc/passwd would otherwise be read and shown, a FIFO would
// hang the reader). Errors name the artifact's URI and the offending name relative to the
// root, never the root itself, since they reach callers.
type Files struct {
	root string   // absolute; URIs are built from it
	dir  *os.Root // pins the folder for the store's life
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// ErrNotRegular is wrapped by the error for an artifact path that is, or passes through,
// anything but a regular file in real folders.
var ErrNotRegular = errors.New("artifacts are regular files under the artifact root, reached without links")

// NewFiles returns a file store rooted at dir (created if missing).
func NewFiles(dir string) (*Files, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("artifact store %s: %w", abs, err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("artifact store %s: %w", abs, err)
	}
	return &Files{root: abs, dir: root}, nil
}

// Root is the folder artifacts live under.
func (f *Files) Root() string { return f.root }

func extFor(mediaType string) string {
	switch mediaType {
	case "application/json":
		return ".json"
	case "text/markdown":
		return ".md"
	case "text/plain":
		return ".txt"
	}
	return ".bin"
}

func (f *Files) Put(_ context.Context, ref Ref, data []byte) (*handoffv1.Artifact, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("artifact %s/%s/%s: %w", ref.JobID, ref.Stage, ref.Type, ErrTooLarge)
	}
	for name, v := range map[string]string{"job_id": ref.JobID, "stage": ref.Stage, "type": ref.Type} {
		if !safeName.MatchString(v) || strings.Contains(v, "..") {
			return nil, fmt.Errorf("artifact: %s %q is not usable in a path", name, v)
		}
	}
	name := fmt.Sprintf("%s-r%d", ref.Stage, ref.Round)
	if ref.Returns > 0 {
		name += fmt.Sprintf("-o%d", ref.Returns)
	}
	if ref.Visit > 0 {
		name += fmt.Sprintf("-v%d", ref.Visit)
	}
	file := ref.Type + extFor(ref.MediaType)
	rel := ref.JobID + "/" + name + "/" + file
	what := "artifact " + rel
	dir, err := f.folder(what, []string{ref.JobID, name}, true)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	// Write to a new temporary file (O_EXCL: never through a link placed there) and rename
	// it over the name, so a reader never sees half an artifact and a link or FIFO already
	// at the name is replaced, not written through.
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := ".tmp-" + hex.EncodeToString(rnd[:])
	fh, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: creating a temporary file: %w", what, cause(err))
	}
	_, err = fh.Write(data)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = dir.Rename(tmp, file)
	}
	if err != nil {
		dir.Remove(tmp)
		return nil, fmt.Errorf("%s: %w", what, cause(err))
	}
	sum := sha256.Sum256(data)
	return &handoffv1.Artifact{
		Type:          ref.Type,
		SchemaVersion: ref.SchemaVersion,
		Uri:           (&url.URL{Scheme: "file", Path: filepath.ToSlash(filepath.Join(f.root, ref.JobID, name, file))}).String(),
		MediaType:     ref.MediaType,
		Sha256:        hex.EncodeToString(sum[:]),
		ProducedBy:    ref.Stage,
	}, nil
}

func (f *Files) Get(_ context.Context, uri string) ([]byte, error) {
	names, err := f.names(uri)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("artifact %q", uri)
	dir, err := f.folder(what, names[:len(names)-1], false)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	rel, last := strings.Join(names, "/"), names[len(names)-1]
	fi, err := dir.Lstat(last)
	if err != nil {
		return nil, pathErr(what, rel, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, refused(what, rel, fi.Mode())
	}
	if fi.Size() > MaxBytes {
		return nil, fmt.Errorf("%s: %w", what, ErrTooLarge)
	}
	// O_NONBLOCK: if a FIFO was swapped in after the Lstat, the open returns at once and
	// the Fstat below refuses it.
	fh, err := dir.OpenFile(last, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, pathErr(what, rel, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, cause(err))
	}
	if !st.Mode().IsRegular() || !os.SameFile(fi, st) {
		return nil, fmt.Errorf("%s: %q changed while it was opened: %w", what, rel, ErrNotRegular)
	}
	// A hard link is a regular file whose bytes may live outside the root: an artifact the
	// store wrote has one name only.
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
		return nil, fmt.Errorf("%s: %q has %d hard links: %w", what, rel, sys.Nlink, ErrNotRegular)
	}
	data, err := io.ReadAll(io.LimitReader(fh, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, cause(err))
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%s: %w", what, ErrTooLarge)
	}
	return data, nil
}

// names returns the path names of a file:// URI below the root, or why it has none.
func (f *Files) names(uri string) ([]string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("artifact uri %q: %w", uri, err)
	}
	if u.Scheme != "file" {
		return nil, fmt.Errorf("artifact uri %q: scheme %q is not served by the file store", uri, u.Scheme)
	}
	return below(f.root, filepath.FromSlash(u.Path), uri)
}

// below splits path into its names relative to root; a path that is the root or outside it
// is an error naming uri (not root: the error reaches callers).
func below(root, path, uri string) ([]string, error) {
	rel, err := filepath.Rel(root, filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("artifact uri %q is outside the artifact root", uri)
	}
	if rel == "." {
		return nil, fmt.Errorf("artifact uri %q names the artifact root, not a file", uri)
	}
	return strings.Split(rel, string(filepath.Separator)), nil
}

// folder opens the folder names[0]/names[1]/... under the root one name at a time: each
// must be a real folder (Lstat, so a link is seen as one) and must still be the folder the
// Lstat saw once opened (os.SameFile), so a link swapped in between is refused too. With
// create, missing folders are made. The caller closes the returned Root.
func (f *Files) folder(what string, names []string, create bool) (*os.Root, error) {
	cur, err := f.dir.OpenRoot(".")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, cause(err))
	}
	for i, name := range names {
		rel := strings.Join(names[:i+1], "/")
		fi, err := cur.Lstat(name)
		if create && errors.Is(err, fs.ErrNotExist) {
			if err = cur.Mkdir(name, 0o755); err == nil || errors.Is(err, fs.ErrExist) {
				fi, err = cur.Lstat(name)
			}
		}
		if err != nil {
			cur.Close()
			return nil, pathErr(what, rel, err)
		}
		if !fi.IsDir() {
			cur.Close()
			return nil, refused(what, rel, fi.Mode())
		}
		next, err := cur.OpenRoot(name)
		cur.Close()
		if err != nil {
			return nil, pathErr(what, rel, err)
		}
		st, err := next.Stat(".")
		if err != nil || !os.SameFile(fi, st) {
			next.Close()
			return nil, fmt.Errorf("%s: %q changed while it was opened: %w", what, rel, ErrNotRegular)
		}
		cur = next
	}
	return cur, nil
}

// kind names a file mode that is not a regular file.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link (links are not followed)"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a folder"
	}
	return "not a regular file"
}

func refused(what, rel string, m fs.FileMode) error {
	return fmt.Errorf("%s: %q is %s: %w", what, rel, kind(m), ErrNotRegular)
}

// pathErr reports a failed file system call on rel, keeping fs.ErrNotExist visible to
// errors.Is.
func pathErr(what, rel string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %q does not exist: %w", what, rel, fs.ErrNotExist)
	}
	return fmt.Errorf("%s: %q: %w", what, rel, cause(err))
}

// cause strips the path from a file system error: an os.File opened through a Root names
// itself by its absolute path, which must not reach a caller.
func cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// Verify checks that data matches the artifact's recorded digest, when it has one.
func Verify(a *handoffv1.Artifact, data []byte) error {
	if a.GetSha256() == "" {
		return nil
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != a.GetSha256() {
		// The digest of what is there is not said: it would tell a caller who guessed a path
		// the digest it needs to pass this check.
		return fmt.Errorf("artifact %s: its bytes do not match the recorded sha256 %s", a.GetUri(), a.GetSha256())
	}
	return nil
}

// WithReturns returns st, or, when returns > 0, st with every Put stored under
// Ref.Returns = returns: the agent runner hands it to an agent re-running a stage after a
// person sent the job back, so the agent's own Refs need not know about it.
func WithReturns(st Store, returns uint32) Store { return WithCompletion(st, returns, 0) }

// WithCompletion is WithReturns that also stores every Put under Ref.Visit = visit (a stage
// a route sent the job back to): st itself when both are 0.
func WithCompletion(st Store, returns, visit uint32) Store {
	if (returns == 0 && visit == 0) || st == nil {
		return st
	}
	return returnsStore{Store: st, returns: returns, visit: visit}
}

type returnsStore struct {
	Store
	returns, visit uint32
}

// Root is the folder of the store it wraps, or "" when that is not a folder.
func (r returnsStore) Root() string {
	if f, ok := r.Store.(interface{ Root() string }); ok {
		return f.Root()
	}
	return ""
}

func (r returnsStore) Put(ctx context.Context, ref Ref, data []byte) (*handoffv1.Artifact, error) {
	ref.Returns, ref.Visit = r.returns, r.visit
	return r.Store.Put(ctx, ref, data)
}
