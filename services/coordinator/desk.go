package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
)

// DeskRetryDelay is the RetryInfo delay of a SubmitJob shed because the desk is full.
const DeskRetryDelay = time.Minute

// openEscalations counts the ESCALATED runs per pipeline, stopping once pipelineName (when
// set) reaches limit: the store is the truth every replica shares.
func (s *Server) openEscalations(ctx context.Context, pipelineName string, limit int) (map[string]int, error) {
	counts := map[string]int{}
	after := ""
	for {
		runs, next, err := s.opts.Store.ListRuns(ctx, handoffv1.JobState_JOB_STATE_ESCALATED, 500, after)
		if err != nil {
			return nil, err
		}
		for _, r := range runs {
			counts[r.GetPipeline()]++
		}
		if next == "" || (pipelineName != "" && counts[pipelineName] >= limit) {
			return counts, nil
		}
		after = next
	}
}

// deskFull reports whether p's escalation queue is at its max_open_escalations, and why.
func (s *Server) deskFull(ctx context.Context, p *pipeline.Pipeline) (bool, string, error) {
	limit := p.Escalation.MaxOpen
	if limit <= 0 {
		return false, "", nil
	}
	counts, err := s.openEscalations(ctx, p.Name, limit)
	if err != nil {
		return false, "", status.Errorf(codes.Unavailable, "store: %v", err)
	}
	n := counts[p.Name]
	return n >= limit, fmt.Sprintf("pipeline %s has %d runs waiting for a person (escalation.max_open_escalations %d)", p.Name, n, limit), nil
}

// shed is SubmitJob's refusal while the desk is full: RESOURCE_EXHAUSTED with a RetryInfo
// delay, before anything is created or spent. (A retry of a request already created is
// refused too while the desk stays full; after the delay it answers the existing run.)
func shed(why string) error {
	st := status.New(codes.ResourceExhausted, why+": intake sheds load until the desk works some off; retry in "+DeskRetryDelay.String())
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(DeskRetryDelay)}); err == nil {
		st = d
	}
	return st.Err()
}

// queueDesc is the escalation queue depth metric.
var queueDesc = prometheus.NewDesc("handoff_escalations_open", "Runs waiting for a person (ESCALATED), by pipeline.", []string{"pipeline"}, nil)

type queueCollector struct{ s *Server }

// QueueCollector is the metric of the escalation queues' depth (handoff_escalations_open,
// by pipeline), read from the store at each scrape.
func (s *Server) QueueCollector() prometheus.Collector { return queueCollector{s} }

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- queueDesc }

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.s.openEscalations(ctx, "", 0)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(queueDesc, err)
		return
	}
	for name := range c.s.opts.Pipelines {
		ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(counts[name]), name)
	}
}

// submitToPerson creates the run ESCALATED (DESK_FULL) at its first stage: the pipeline
// degrades to human-only while its desk is full, so no agent is called and nothing spent.
func (s *Server) submitToPerson(ctx context.Context, p *pipeline.Pipeline, job *handoffv1.Job, req *handoffv1.SubmitJobRequest, submitted *handoffv1.JobEvent, why string) (*handoffv1.SubmitJobResponse, error) {
	job.State, job.Escalations = handoffv1.JobState_JOB_STATE_ESCALATED, 1
	job.Escalation = &handoffv1.Escalation{Cause: handoffv1.EscalationCause_ESCALATION_CAUSE_DESK_FULL, Stage: job.GetStage(),
		Detail: why + ": the pipeline sends new jobs straight to a person (when_full: human)", Route: p.Escalation.Route, At: timestamppb.New(s.opts.Now()), Number: 1}
	escalated := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_ESCALATED, Stage: job.GetStage(), Escalation: job.GetEscalation()}
	s.stamp(job, escalated)
	run, created, err := s.opts.Store.CreateRun(ctx, job, submitted, escalated)
	if err != nil {
		return nil, createRunErr(err, req)
	}
	if !created {
		return &handoffv1.SubmitJobResponse{Job: run, Existing: true}, nil
	}
	s.published(run.GetRunId(), []*handoffv1.JobEvent{submitted, escalated})
	s.log.Info("job submitted straight to a person (desk full)", "run_id", run.GetRunId(), "job_id", run.GetJobId(), "pipeline", p.Name)
	s.deliver(run, p)
	return &handoffv1.SubmitJobResponse{Job: run}, nil
}
