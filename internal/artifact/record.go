package artifact

import (
	"context"
	"slices"
	"sync"
)

// MaxReads caps the reads a Recorder keeps: the StageResult's artifacts_read cap.
const MaxReads = 64

// Recorder is a Store that remembers which artifact URIs were read through it (Get that
// succeeded), in the order first read, each once: the agent runner hands one to each stage
// run and puts Reads in the StageResult, so "did the stage read the file, or the chat?"
// is answered by the runtime, not by the agent.
type Recorder struct {
	Store
	mu   sync.Mutex
	uris []string
}

// Recording wraps st.
func Recording(st Store) *Recorder { return &Recorder{Store: st} }

// Get reads through the wrapped store and records uri when the read succeeded.
func (r *Recorder) Get(ctx context.Context, uri string) ([]byte, error) {
	b, err := r.Store.Get(ctx, uri)
	if err == nil {
		r.mu.Lock()
		if !slices.Contains(r.uris, uri) && len(r.uris) < MaxReads {
			r.uris = append(r.uris, uri)
		}
		r.mu.Unlock()
	}
	return b, err
}

// Reads returns the URIs read so far.
func (r *Recorder) Reads() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.uris)
}

// Root is the folder of the store it wraps, or "" when that is not a folder.
func (r *Recorder) Root() string {
	if f, ok := r.Store.(interface{ Root() string }); ok {
		return f.Root()
	}
	return ""
}
