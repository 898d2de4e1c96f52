package chaos

import (
	"testing"
	"time"

	"github.com/handoffhq/handoff/internal/testkit"
)

// step is one event of a resume script, at ms milliseconds into the run: a kill of kind,
// a call of job failed in a way blamed on kinds, or a call of job that made progress.
type step struct {
	ms       int
	kill     string
	failed   string
	blamed   []string
	progress string
}

func kill(ms int, kind string) step { return step{ms: ms, kill: kind} }
func fail(ms int, job string, kinds ...string) step {
	return step{ms: ms, failed: job, blamed: kinds}
}
func progress(ms int, job string) step { return step{ms: ms, progress: job} }

func TestTimeToResume(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		want  map[string]ResumeStats
	}{{
		name:  "a job stalled by a kill resumes at its next progress",
		steps: []step{kill(0, kindRunner), fail(10, "j1", kindRunner), progress(300, "j1")},
		want:  map[string]ResumeStats{kindRunner: {Samples: 1, P50ms: 300, P99ms: 300, MaxMs: 300}},
	}, {
		name: "retries failing under the same outage do not restart the clock",
		steps: []step{kill(0, kindWriteback), fail(10, "j1", kindWriteback), fail(100, "j1", kindWriteback),
			fail(200, "j1", processKinds...), progress(400, "j1")},
		want: map[string]ResumeStats{kindWriteback: {Samples: 1, P50ms: 400, P99ms: 400, MaxMs: 400}},
	}, {
		name: "a later kill that breaks a stalled job's call again takes the job over",
		steps: []step{kill(0, kindRunner), fail(10, "j1", processKinds...), fail(10, "j2", processKinds...),
			progress(200, "j2"), kill(500, kindWriteback), fail(510, "j1", processKinds...), progress(650, "j1")},
		want: map[string]ResumeStats{
			kindRunner:    {Samples: 1, Interrupted: 1, P50ms: 200, P99ms: 200, MaxMs: 200},
			kindWriteback: {Samples: 1, P50ms: 150, P99ms: 150, MaxMs: 150},
		},
	}, {
		name: "a failure blamed on a kind whose last kill is older than the stall keeps the stall",
		steps: []step{kill(0, kindRunner), kill(100, kindCoordinator), fail(110, "j1", kindCoordinator),
			fail(200, "j1", kindRunner), progress(600, "j1")},
		want: map[string]ResumeStats{kindRunner: {}, kindCoordinator: {Samples: 1, P50ms: 500, P99ms: 500, MaxMs: 500}},
	}, {
		name: "a failure long after the last kill, or blamed on no kind, stalls nothing",
		steps: []step{kill(0, kindCoordinator), fail(int(outageWindow/time.Millisecond)+1, "j1", kindCoordinator),
			fail(20, "j2"), progress(30_000, "j1"), progress(30_000, "j2"), progress(30_000, "j3")},
		want: map[string]ResumeStats{kindCoordinator: {}},
	}, {
		name: "p50 and p99 are nearest-rank over the kind's jobs",
		steps: []step{kill(0, kindCoordinator), fail(1, "a", kindCoordinator), fail(1, "b", kindCoordinator),
			fail(1, "c", kindCoordinator), progress(100, "a"), progress(300, "b"), progress(200, "c")},
		want: map[string]ResumeStats{kindCoordinator: {Samples: 3, P50ms: 200, P99ms: 300, MaxMs: 300}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
			var now time.Time
			r := newResumes()
			r.now = func() time.Time { return now }
			for _, s := range tc.steps {
				now = start.Add(time.Duration(s.ms) * time.Millisecond)
				switch {
				case s.kill != "":
					r.killed(s.kill)
				case s.failed != "":
					r.failed(s.failed, s.blamed...)
				default:
					r.progressed(s.progress)
				}
			}
			testkit.Equal(t, r.report(), tc.want, "time to resume")
		})
	}
}
