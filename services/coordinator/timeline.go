package coordinator

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Timeline folds a run's events into its hop timeline: one record per hop (stage, ack, the
// move after it, spend, verdict, duration, how it ended the run) and one per decision of a
// person. Pure: the events are the record, the timeline only a reading of them.
func Timeline(evs []*handoffv1.JobEvent) []*handoffv1.HopRecord {
	var out []*handoffv1.HopRecord
	var cur *handoffv1.HopRecord
	var started *handoffv1.JobEvent // the event cur's duration counts from
	open := func(ev *handoffv1.JobEvent) {
		cur = &handoffv1.HopRecord{Hop: ev.GetHop(), Stage: ev.GetStage(), At: ev.GetAt()}
		started = ev
		out = append(out, cur)
	}
	touch := func(ev *handoffv1.JobEvent) {
		if ev.GetAt() != nil && started.GetAt() != nil {
			cur.Duration = durationpb.New(ev.GetAt().AsTime().Sub(started.GetAt().AsTime()))
		}
		if t := ev.GetTransfer(); t != nil {
			cur.Transfer = t
		}
	}
	for _, ev := range evs {
		switch ev.GetKind() {
		case handoffv1.EventKind_EVENT_KIND_SUBMITTED, handoffv1.EventKind_EVENT_KIND_ESCALATION_DELIVERY:
			continue
		case handoffv1.EventKind_EVENT_KIND_PACKAGE_SENT:
			open(ev)
		case handoffv1.EventKind_EVENT_KIND_RESOLVED:
			cur = &handoffv1.HopRecord{Hop: ev.GetHop(), Stage: ev.GetStage(), At: ev.GetAt(), Resolution: ev.GetResolution(), Transfer: ev.GetTransfer()}
			out = append(out, cur)
			cur, started = nil, nil
			continue
		case handoffv1.EventKind_EVENT_KIND_ESCALATED, handoffv1.EventKind_EVENT_KIND_COMPLETED, handoffv1.EventKind_EVENT_KIND_FAILED:
			// The end of the run belongs to the hop that led to it, or stands alone (an
			// escalation before any hop, a failure after a decision).
			if cur == nil || cur.GetEnd() != handoffv1.EventKind_EVENT_KIND_UNSPECIFIED || (ev.GetHop() != 0 && ev.GetHop() != cur.GetHop()) {
				open(ev)
			}
			cur.End, cur.Escalation = ev.GetKind(), ev.GetEscalation()
			touch(ev)
			continue
		default:
			if cur == nil || ev.GetHop() != cur.GetHop() || cur.GetEnd() != handoffv1.EventKind_EVENT_KIND_UNSPECIFIED {
				open(ev)
			}
		}
		switch ev.GetKind() {
		case handoffv1.EventKind_EVENT_KIND_ACK:
			cur.Ack = ev.GetAck().GetStatus()
		case handoffv1.EventKind_EVENT_KIND_STAGE_RESULT:
			cur.SpentUsdMicros += ev.GetResult().GetSpentUsdMicros()
		case handoffv1.EventKind_EVENT_KIND_VERDICT:
			cur.Verdict = ev.GetEvaluator().GetLastVerdict()
		case handoffv1.EventKind_EVENT_KIND_RECEIPT:
			cur.Receipt = ev.GetReceipt()
		}
		touch(ev)
	}
	return out
}

// timelineOf reads run runID's events and folds them (Timeline).
func (s *Server) timelineOf(ctx context.Context, runID string) ([]*handoffv1.HopRecord, error) {
	evs, err := s.opts.Store.Events(ctx, runID, 0)
	if err != nil {
		return nil, err
	}
	return Timeline(evs), nil
}
