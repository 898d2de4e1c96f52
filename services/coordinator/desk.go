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

// deskFull sheds a new job of p when p's escalation queue is at its max_open_escalations:
// RESOURCE_EXHAUSTED with a RetryInfo delay, before anything is created or spent.
func (s *Server) deskFull(ctx context.Context, p *pipeline.Pipeline) error {
	limit := p.Escalation.MaxOpen
	if limit <= 0 {
		return nil
	}
	counts, err := s.openEscalations(ctx, p.Name, limit)
	if err != nil {
		return status.Errorf(codes.Unavailable, "store: %v", err)
	}
	n := counts[p.Name]
	if n < limit {
		return nil
	}
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("pipeline %s has %d runs waiting for a person (escalation.max_open_escalations %d): intake sheds load until the desk works some off; retry in %s",
		p.Name, n, limit, DeskRetryDelay))
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
