// Package artifact stores what stages produce, so packages can carry a URI instead of the
// payload. The default store is a folder on local disk (file:// URIs); every stage of a
// deployment must see the same folder (one machine, or a shared volume).
package artifact

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

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

// Files stores artifacts under a root folder.
type Files struct {
	root string
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// NewFiles returns a file store rooted at dir (created if missing).
func NewFiles(dir string) (*Files, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("artifact store %s: %w", abs, err)
	}
	return &Files{root: abs}, nil
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
	dir := filepath.Join(f.root, ref.JobID, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, ref.Type+extFor(ref.MediaType))
	// Write to a temporary file and rename, so a reader never sees half an artifact.
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return nil, err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return nil, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return nil, err
	}
	sum := sha256.Sum256(data)
	return &handoffv1.Artifact{
		Type:          ref.Type,
		SchemaVersion: ref.SchemaVersion,
		Uri:           (&url.URL{Scheme: "file", Path: filepath.ToSlash(path)}).String(),
		MediaType:     ref.MediaType,
		Sha256:        hex.EncodeToString(sum[:]),
		ProducedBy:    ref.Stage,
	}, nil
}

func (f *Files) Get(_ context.Context, uri string) ([]byte, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("artifact uri %q: %w", uri, err)
	}
	if u.Scheme != "file" {
		return nil, fmt.Errorf("artifact uri %q: scheme %q is not served by the file store", uri, u.Scheme)
	}
	path := filepath.Clean(filepath.FromSlash(u.Path))
	if rel, err := filepath.Rel(f.root, path); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("artifact uri %q is outside the artifact root %s", uri, f.root)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("artifact %q: %w", uri, err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("artifact %q: %w", uri, ErrTooLarge)
	}
	return data, nil
}

// Verify checks that data matches the artifact's recorded digest, when it has one.
func Verify(a *handoffv1.Artifact, data []byte) error {
	if a.GetSha256() == "" {
		return nil
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != a.GetSha256() {
		return fmt.Errorf("artifact %s: sha256 %s does not match recorded %s", a.GetUri(), got, a.GetSha256())
	}
	return nil
}

// WithReturns returns st, or, when returns > 0, st with every Put stored under
// Ref.Returns = returns: the agent runner hands it to an agent re-running a stage after a
// person sent the job back, so the agent's own Refs need not know about it.
func WithReturns(st Store, returns uint32) Store {
	if returns == 0 || st == nil {
		return st
	}
	return returnsStore{Store: st, returns: returns}
}

type returnsStore struct {
	Store
	returns uint32
}

// Root is the folder of the store it wraps, or "" when that is not a folder.
func (r returnsStore) Root() string {
	if f, ok := r.Store.(interface{ Root() string }); ok {
		return f.Root()
	}
	return ""
}

func (r returnsStore) Put(ctx context.Context, ref Ref, data []byte) (*handoffv1.Artifact, error) {
	ref.Returns = r.returns
	return r.Store.Put(ctx, ref, data)
}
