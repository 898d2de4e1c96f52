package coordinator

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/pipeline"
)

// Personal data is kept out of packages by the pipeline's pii policy (pipeline.PII), at the
// places free text enters a run:
//
//   - SubmitJob (goal, constraints): reject answers InvalidArgument naming each field
//     (BadRequest reason PII); redact keeps each value in the vault and submits the job
//     with its ref ("pii:<id>") in place, so the run, its events and every package hold only
//     the ref.
//   - a stage's result (open_questions, next_hint), before any of it is recorded: reject
//     treats the result as invalid (the run escalates STAGE_FAILED naming the fields),
//     redact replaces the values.
//   - ResolveEscalation (the operator's comment, a fail reason): as SubmitJob.
//   - before each hop, the run's own state (which predates the policy when the pipeline file
//     changed): reject escalates REJECTED_SCHEMA naming the fields, redact replaces them.
//
// Receivers refuse what still gets through (interceptor/validate). No message, log line or
// event here holds a value: findings name the field and the kind of data only.

// piiSetup builds each pipeline's detector and refuses a redacting pipeline without a vault.
func (s *Server) piiSetup() error {
	s.pii = map[string]*pii.Detector{}
	for name, p := range s.opts.Pipelines {
		d, err := p.PIIDetector()
		if err != nil {
			return fmt.Errorf("coordinator: pipeline %s: %w", name, err)
		}
		if p.PIIPolicy() == pipeline.PIIRedact && s.opts.PIIVault == nil {
			return fmt.Errorf("coordinator: pipeline %s has pii.policy redact but no vault is configured (--pii-vault)", name)
		}
		s.pii[name] = d
	}
	return nil
}

// screen applies p's policy to m for job jobID: under redact m is redacted in place and the
// reasons are nil; under reject m is left alone and the reasons name what it holds (nil:
// nothing). The error is the vault failing (Unavailable): a value that cannot be kept apart
// must not go on.
func (s *Server) screen(ctx context.Context, p *pipeline.Pipeline, jobID string, m proto.Message) ([]*handoffv1.Reason, error) {
	d := s.pii[p.Name]
	if d == nil {
		d = pii.Builtin()
	}
	if p.PIIPolicy() != pipeline.PIIRedact {
		return pii.Reasons("", d.Scan(m)), nil
	}
	fs, err := d.Redact(ctx, m, jobID, s.opts.PIIVault)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "%v", err)
	}
	if len(fs) > 0 {
		s.log.Info("personal data redacted into the vault", "job_id", jobID, "pipeline", p.Name, "fields", fieldNames(fs))
	}
	return nil, nil
}

// piiSubmit is SubmitJob's screen: the request to go on with (a redacted copy under
// redact), or InvalidArgument naming each field that holds personal data.
func (s *Server) piiSubmit(ctx context.Context, p *pipeline.Pipeline, req *handoffv1.SubmitJobRequest) (*handoffv1.SubmitJobRequest, error) {
	return screenRequest(ctx, s, p, req.GetJobId(), req)
}

// piiResolve is ResolveEscalation's: an operator's comment and reason become the run's next
// hint and its stored resolution, so they are screened as a job's own text is.
func (s *Server) piiResolve(ctx context.Context, p *pipeline.Pipeline, jobID string, req *handoffv1.ResolveEscalationRequest) (*handoffv1.ResolveEscalationRequest, error) {
	return screenRequest(ctx, s, p, jobID, req)
}

func screenRequest[M proto.Message](ctx context.Context, s *Server, p *pipeline.Pipeline, jobID string, req M) (M, error) {
	out := proto.Clone(req).(M)
	reasons, err := s.screen(ctx, p, jobID, out)
	if err != nil {
		return out, err
	}
	if len(reasons) > 0 {
		s.log.Info("request refused: personal data in its free text", "job_id", jobID, "pipeline", p.Name, "fields", reasonFields(reasons))
		return out, validate.InvalidArgument(reasons)
	}
	return out, nil
}

// piiBeforeSend screens the run's own free text before a hop is sent. ok=false means the
// run is clean (or was redacted in place, saved with the hop); otherwise t escalates it.
func (s *Server) piiBeforeSend(ctx context.Context, p *pipeline.Pipeline, job *handoffv1.Job) (t transition, ok bool, err error) {
	reasons, err := s.screen(ctx, p, job.GetJobId(), job)
	if err != nil || len(reasons) == 0 {
		return transition{}, false, err
	}
	return escalation(handoffv1.EscalationCause_ESCALATION_CAUSE_REJECTED_SCHEMA,
		fmt.Sprintf("the package for stage %s would carry personal data (%s): pii.policy is reject", job.GetStage(), reasonFields(reasons)), reasons), true, nil
}

func fieldNames(fs []pii.Finding) string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Field + " (" + f.Kind + ")"
	}
	return strings.Join(out, ", ")
}

func reasonFields(rs []*handoffv1.Reason) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.GetField()
	}
	return strings.Join(out, ", ")
}
