package chaos

import (
	"slices"
	"sync"
	"time"
)

// Time to resume: how long after a kill the work it interrupted goes on. At each kill the
// harness opens an outage of that kind. A job whose call through the hop proxy fails in
// the way that kind of kill fails it, while such an outage is open, is stalled by it: its
// caller hung up (a coordinator died), the runner's or the writeback's connection broke
// (that service died), the service answered Unavailable naming its store (a master or the
// Redis died). The first call of that job that makes progress afterwards (an ACCEPTED or
// DUPLICATE ack, a write answered) is its resume, and kill-to-resume is one sample of the
// outage's kind. A stalled job whose call is broken again by a later kill is stalled by
// that one from then on: the clock runs from the last kill that broke its work, and the
// earlier stall is counted as interrupted, not as a resume. Blaming the first kill would
// give the samples of a kind that mostly hits jobs already stalled (a writeback killed
// while jobs retry after another kill) to the other kind, and stretch that kind's times
// by the overlap.

// outageWindow is how long after a kill a failed call is still blamed on it.
const outageWindow = 10 * time.Second

// kill kinds, as the report names them.
const (
	kindCoordinator = "coordinator"
	kindRunner      = "agentrunner"
	kindWriteback   = "writeback"
	kindMaster      = "redis-master"
	kindRedis       = "redis-restart"
)

type outage struct {
	kind string
	at   time.Time
}

type resumes struct {
	now         func() time.Time
	mu          sync.Mutex
	last        map[string]*outage         // kind -> its latest outage
	stalled     map[string]*outage         // job -> the outage that stalled it
	samples     map[string][]time.Duration // kind -> kill-to-resume
	interrupted map[string]int             // kind -> its stalls broken again by a later kill
}

func newResumes() *resumes {
	return &resumes{now: time.Now, last: map[string]*outage{}, stalled: map[string]*outage{},
		samples: map[string][]time.Duration{}, interrupted: map[string]int{}}
}

// killed opens an outage of kind now.
func (r *resumes) killed(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[kind] = &outage{kind: kind, at: r.now()}
	if _, ok := r.samples[kind]; !ok {
		r.samples[kind] = nil
	}
}

// failed records that a call of job failed as a kill of one of kinds fails it: the job is
// stalled by the latest recent outage of those kinds, unless it is stalled already by that
// outage or a later one.
func (r *resumes) failed(job string, kinds ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	var o *outage
	for _, k := range kinds {
		if l := r.last[k]; l != nil && now.Sub(l.at) <= outageWindow && (o == nil || l.at.After(o.at)) {
			o = l
		}
	}
	prev := r.stalled[job]
	switch {
	case o == nil:
		return
	case prev == nil:
	case !o.at.After(prev.at):
		return
	default:
		r.interrupted[prev.kind]++
	}
	r.stalled[job] = o
}

// progressed records that a call of job made progress: a stalled job has resumed.
func (r *resumes) progressed(job string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.stalled[job]
	if o == nil {
		return
	}
	delete(r.stalled, job)
	r.samples[o.kind] = append(r.samples[o.kind], r.now().Sub(o.at))
}

// ResumeStats are the kill-to-resume times of one kind of kill, in milliseconds.
type ResumeStats struct {
	Samples int `json:"samples"`
	// Interrupted counts the jobs this kind stalled whose calls a later kill broke again
	// before they resumed: each is a sample of that later kill instead.
	Interrupted int   `json:"interrupted"`
	P50ms       int64 `json:"p50_ms"`
	P99ms       int64 `json:"p99_ms"`
	MaxMs       int64 `json:"max_ms"`
}

func (r *resumes) report() map[string]ResumeStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]ResumeStats{}
	for kind, ds := range r.samples {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		st := ResumeStats{Samples: len(ds), Interrupted: r.interrupted[kind]}
		if len(ds) > 0 {
			st.P50ms = quantile(ds, 0.50).Milliseconds()
			st.P99ms = quantile(ds, 0.99).Milliseconds()
			st.MaxMs = ds[len(ds)-1].Milliseconds()
		}
		out[kind] = st
	}
	return out
}

// quantile is the nearest-rank quantile q of sorted ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}
