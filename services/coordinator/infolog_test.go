package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/testkit"
)

// The job's and the stage's info lines are built only when the logger writes info; at info
// (here debug) they are written, each naming its job: a job's submit, each stage's
// completion at the runner, and the job's end.
func TestInfoLinesWrittenAtInfo(t *testing.T) {
	e := startPII(t, nil, "", "", []handoffv1.Verdict{handoffv1.Verdict_VERDICT_PASS}, nil)
	e.judge.hint = "cite the refund policy"
	resp, err := e.client.SubmitJob(context.Background(), e.request("relay", "tkt_info", "req-info", e.defaultBudget))
	if err != nil {
		t.Fatal(err)
	}
	job, _ := e.run(t, resp.GetJob().GetRunId())
	if job.GetState() != handoffv1.JobState_JOB_STATE_COMPLETED {
		t.Fatalf("job ended %v, want COMPLETED", job.GetState())
	}
	for _, want := range []string{"msg=\"job submitted\"", "msg=\"agentrunner: stage completed\"", "msg=\"job ended\""} {
		var lines []string
		// The watch ends at the terminal event, which the driver saves before it logs "job
		// ended": wait for the line.
		testkit.Eventually(t, 10*time.Second, "a "+want+" line at debug level", func() bool {
			lines = lines[:0]
			for _, l := range strings.Split(e.logs.String(), "\n") {
				if strings.Contains(l, want) {
					lines = append(lines, l)
				}
			}
			return len(lines) > 0
		})
		for _, l := range lines {
			if !strings.Contains(l, "job_id=tkt_info") {
				t.Errorf("line %q does not name the job", l)
			}
		}
	}
}
