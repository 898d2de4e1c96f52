package coordinator

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/artifact"
	"github.com/handoffhq/handoff/internal/store"
)

// What SubmitJob refuses before or while it creates a run: inputs that are neither the job's
// own nor pinned by a digest, and job_id or request_id reused for something else.

// inputsProblem returns the first input that is neither stored in the job's own artifact
// folder under root (artifact.InJobFolder) nor pinned by a sha256 its reader checks
// (artifact.Verify), as the field to name and why; "" when every input is one or the
// other. Without a root (a coordinator with no artifact folder) only pinned inputs pass.
// A pure rule: nothing is opened here, the reader still refuses what is not a regular file
// under its root.
func inputsProblem(root, jobID string, inputs []*handoffv1.Artifact) (field, why string) {
	for i, a := range inputs {
		if a.GetSha256() != "" || artifact.InJobFolder(root, jobID, a.GetUri()) {
			continue
		}
		// The root is not named: an absolute path of this host is no business of the caller.
		return fmt.Sprintf("inputs[%d].uri", i), fmt.Sprintf("not in job %s's own artifact folder, and inputs[%d].sha256 is empty: "+
			"store the input for this job (its folder under the artifact root) or give the sha256 its reader checks", jobID, i)
	}
	return "", ""
}

// fieldError is a status naming field, with a google.rpc.BadRequest detail for it.
func fieldError(code codes.Code, field, msg string) error {
	st := status.New(code, fmt.Sprintf("%s: %s", field, msg))
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}}); err == nil {
		st = d
	}
	return st.Err()
}

// createRunErr maps CreateRun's refusals to the caller's mistake, and anything else to the
// store being unavailable.
//
//   - job_id submitted before with other content: AlreadyExists, the code for "what you ask
//     to create is there": the job exists, and is another job than the one sent.
//   - request_id used before for a different request: FailedPrecondition. The request is
//     fine on its own and nothing by that name is being created twice; what fails is a
//     precondition of request ids (one id, one request), which the caller must fix by
//     choosing a new id: retrying as is never helps (as with the IETF Idempotency-Key
//     draft's 422). It also keeps the two refusals apart by code, not only by field.
func createRunErr(err error, req *handoffv1.SubmitJobRequest) error {
	switch {
	case errors.Is(err, store.ErrJobConflict):
		return fieldError(codes.AlreadyExists, "job_id", fmt.Sprintf("job %q already exists with a different goal, constraints, pipeline, inputs or memory_refs: "+
			"a job's content is fixed by its first submission; submit the same content to run it again, or other content under a new job_id", req.GetJobId()))
	case errors.Is(err, store.ErrRequestConflict):
		return fieldError(codes.FailedPrecondition, "request_id", fmt.Sprintf("request %q was used before for a different request: "+
			"a retry must repeat its request exactly; use a new request_id for a new request", req.GetRequestId()))
	}
	return status.Errorf(codes.Unavailable, "store: %v", err)
}

// artifactRoot is the folder of the coordinator's artifact store, "" when it has none.
func (s *Server) artifactRoot() string {
	if f, ok := s.opts.Artifacts.(interface{ Root() string }); ok {
		return f.Root()
	}
	return ""
}
