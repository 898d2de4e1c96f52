package coordinator

import (
	"context"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
)

// subJob runs the subjob stage st of job.
func (s *Server) subJob(ctx context.Context, job *handoffv1.Job, p *pipeline.Pipeline, st *pipeline.Stage, w stepWallet) error {
	return s.apply(ctx, job, p, w, escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_SUBJOB_ESCALATED, "sub-jobs are not built yet", nil), nil)
}
