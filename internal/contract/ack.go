package contract

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

// Caps of the Ack's own fields (see handoff.v1.Ack). Values from a package that do not fit
// are left out of the Ack rather than copied, so an Ack built for a broken package still
// passes its own validation.
const (
	ackJobIDMax       = 128
	ackStageMax       = 64
	ackTraceparentMax = 55
	ackSchemaMax      = 64
	ackReasonsMax     = 64
)

// ident is what an Ack echoes from the package it answers.
type ident struct {
	schema, jobID, stage, traceparent string
}

// AckFor builds the Ack for a v1 package: it copies job_id, stage, schema and
// trace.traceparent from the package when present (and when they fit the Ack's own field
// caps). p may be nil. More than 64 reasons are cut to 63 plus one "reasons.truncated".
func AckFor(p *handoffv1.HandoffPackage, status handoffv1.AckStatus, reasons ...*handoffv1.Reason) *handoffv1.Ack {
	var id ident
	if p != nil {
		id = ident{p.GetSchema(), p.GetJobId(), p.GetStage(), p.GetTrace().GetTraceparent()}
	}
	return buildAck(id, status, reasons)
}

// AckForMessage does what AckFor does for a decoded *handoffv1.HandoffPackage or
// *handoffv2.HandoffPackage; any other message, or nil, gives an Ack with no identity.
func AckForMessage(m proto.Message, status handoffv1.AckStatus, reasons ...*handoffv1.Reason) *handoffv1.Ack {
	var id ident
	switch p := m.(type) {
	case *handoffv1.HandoffPackage:
		if p != nil {
			id = ident{p.GetSchema(), p.GetJobId(), p.GetStage(), p.GetTrace().GetTraceparent()}
		}
	case *handoffv2.HandoffPackage:
		if p != nil {
			id = ident{p.GetSchema(), p.GetJobId(), p.GetStage(), p.GetTrace().GetTraceparent()}
		}
	}
	return buildAck(id, status, reasons)
}

// AckJSON checks a JSON package with CheckJSON and answers it: ACCEPTED with no reasons, or
// REJECTED_SCHEMA with the reasons. When the package could not be decoded (bad version,
// unknown field, bad JSON) the identity fields are peeked from the raw JSON on a best-effort
// basis, so even the ack for a "handoff.v9" package names the job, stage, schema and trace it
// belongs to. It returns the decoded message as CheckJSON does.
func (v *Validator) AckJSON(data []byte) (proto.Message, *handoffv1.Ack) {
	m, reasons := v.CheckJSON(data)
	if len(reasons) == 0 {
		return m, AckForMessage(m, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	}
	if m != nil {
		return m, AckForMessage(m, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, reasons...)
	}
	var id ident
	if len(data) <= MaxPackageBytes {
		id = peekIdent(data)
	}
	return nil, buildAck(id, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, reasons)
}

// peekIdent reads the identity members of an undecodable package. Members of the wrong type
// are ignored.
func peekIdent(data []byte) ident {
	var raw struct {
		Schema     json.RawMessage `json:"schema"`
		JobID      json.RawMessage `json:"job_id"`
		JobIDCamel json.RawMessage `json:"jobId"`
		Stage      json.RawMessage `json:"stage"`
		Trace      json.RawMessage `json:"trace"`
	}
	if json.Unmarshal(data, &raw) != nil {
		return ident{}
	}
	str := func(r json.RawMessage) string {
		var s string
		if json.Unmarshal(r, &s) != nil {
			return ""
		}
		return s
	}
	id := ident{schema: str(raw.Schema), jobID: str(raw.JobID), stage: str(raw.Stage)}
	if id.jobID == "" {
		id.jobID = str(raw.JobIDCamel)
	}
	var tr struct {
		Traceparent json.RawMessage `json:"traceparent"`
	}
	if json.Unmarshal(raw.Trace, &tr) == nil {
		id.traceparent = str(tr.Traceparent)
	}
	return id
}

func fit(s string, n int) string {
	if len(s) > n || !utf8.ValidString(s) {
		return ""
	}
	return s
}

func buildAck(id ident, status handoffv1.AckStatus, reasons []*handoffv1.Reason) *handoffv1.Ack {
	if len(reasons) > ackReasonsMax {
		more := len(reasons) - (ackReasonsMax - 1)
		reasons = append(reasons[:ackReasonsMax-1:ackReasonsMax-1], &handoffv1.Reason{
			Rule:    "reasons.truncated",
			Message: fmt.Sprintf("%d more reasons not shown", more),
		})
	}
	return &handoffv1.Ack{
		Status:      status,
		JobId:       fit(id.jobID, ackJobIDMax),
		Stage:       fit(id.stage, ackStageMax),
		Traceparent: fit(id.traceparent, ackTraceparentMax),
		Schema:      fit(id.schema, ackSchemaMax),
		Reasons:     reasons,
	}
}
