package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/pipeline"
)

// webhookBody is what an escalation's webhook receives.
type webhookBody struct {
	RunID      string `json:"run_id"`
	JobID      string `json:"job_id"`
	Pipeline   string `json:"pipeline"`
	Escalation uint32 `json:"escalation"`
	Cause      string `json:"cause"`
	Stage      string `json:"stage"`
	Detail     string `json:"detail"`
	Route      string `json:"route"`
	Link       string `json:"link,omitempty"`
}

// deliver POSTs the run's new escalation to its route's webhook (the pipeline's, else
// Options.EscalationWebhook), in the background, retrying with backoff; the outcome is an
// EVENT_KIND_ESCALATION_DELIVERY event on the run, so a failed delivery shows on its page.
// Idempotency-Key is "<run_id>:<escalation number>": a receiver sees retries as one.
func (s *Server) deliver(job *handoffv1.Job, p *pipeline.Pipeline) {
	target := p.Escalation.Webhook
	if target == "" {
		target = s.opts.EscalationWebhook
	}
	if target == "" {
		return
	}
	esc := job.GetEscalation()
	body := webhookBody{RunID: job.GetRunId(), JobID: job.GetJobId(), Pipeline: job.GetPipeline(), Escalation: esc.GetNumber(),
		Cause: strings.TrimPrefix(esc.GetCause().String(), "ESCALATION_CAUSE_"), Stage: esc.GetStage(), Detail: esc.GetDetail(), Route: esc.GetRoute()}
	if s.opts.DeskURL != "" {
		body.Link = strings.TrimSuffix(s.opts.DeskURL, "/") + "/jobs/" + url.PathEscape(job.GetRunId())
	}
	data, err := json.Marshal(body)
	if err != nil {
		return
	}
	ev := &handoffv1.JobEvent{RunId: job.GetRunId(), JobId: job.GetJobId(), Kind: handoffv1.EventKind_EVENT_KIND_ESCALATION_DELIVERY, Stage: job.GetStage(), Hop: job.GetHops()}
	key := fmt.Sprintf("%s:%d", job.GetRunId(), esc.GetNumber())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		d := s.post(target, key, data)
		d.Escalation = esc.GetNumber()
		ev.Delivery, ev.At = d, d.GetAt()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.opts.Store.AppendEvent(ctx, job.GetRunId(), ev); err != nil {
			s.log.Warn("record the escalation's webhook delivery", "run_id", job.GetRunId(), "err", err)
		}
		if d.GetDelivered() {
			s.log.Info("escalation delivered", "run_id", job.GetRunId(), "url", target, "attempts", d.GetAttempts())
		} else {
			s.log.Warn("escalation delivery failed", "run_id", job.GetRunId(), "url", target, "attempts", d.GetAttempts(), "err", d.GetError())
		}
	}()
}

// post sends data to target with key, up to WebhookAttempts times while the failure may pass
// (no answer, 429, 5xx), waiting WebhookBackoff, doubling, between tries.
func (s *Server) post(target, key string, data []byte) *handoffv1.Delivery {
	d := &handoffv1.Delivery{Url: target}
	wait := s.opts.WebhookBackoff
	for d.Attempts < uint32(s.opts.WebhookAttempts) {
		if d.Attempts > 0 {
			select {
			case <-time.After(wait):
			case <-s.ctx.Done():
				d.Error += " (coordinator stopped)"
				d.At = timestamppb.New(s.opts.Now())
				return d
			}
			wait *= 2
		}
		d.Attempts++
		req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, target, bytes.NewReader(data))
		if err != nil {
			d.Error = err.Error()
			break
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := s.opts.HTTPClient.Do(req)
		if err != nil {
			d.Error, d.StatusCode = err.Error(), 0
			continue
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		d.StatusCode = int32(resp.StatusCode)
		if resp.StatusCode/100 == 2 {
			d.Delivered, d.Error = true, ""
			break
		}
		d.Error = "answered " + resp.Status
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
			break // the receiver refuses this delivery: trying again will not change that
		}
	}
	d.At = timestamppb.New(s.opts.Now())
	return d
}

// Delivery is the latest webhook delivery of the run's current escalation, nil when none
// was recorded (yet, or no webhook is set).
func (s *Server) Delivery(ctx context.Context, job *handoffv1.Job) (*handoffv1.Delivery, error) {
	evs, err := s.opts.Store.Events(ctx, job.GetRunId(), 0)
	if err != nil {
		return nil, err
	}
	n := escalationNumber(job.GetEscalation())
	for i := len(evs) - 1; i >= 0; i-- {
		if d := evs[i].GetDelivery(); evs[i].GetKind() == handoffv1.EventKind_EVENT_KIND_ESCALATION_DELIVERY && d.GetEscalation() == n {
			return d, nil
		}
	}
	return nil, nil
}
