package validate_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop/hoptest"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/testkit"
)

const card = "4111111111111111"

// A receiver fails closed on personal data the coordinator should have kept out: the
// package is REJECTED_SCHEMA with rule pii naming each field, the handler never runs, and
// nothing the receiver answers holds the value.
func TestPIIRefusedAtTheReceiver(t *testing.T) {
	v := newValidator(t)
	for _, c := range []struct {
		name   string
		mod    func(*handoffv1.HandoffPackage)
		fields []string
	}{
		{"card in the goal", func(p *handoffv1.HandoffPackage) { p.Goal = "refund card " + card }, []string{"goal"}},
		{"grouped card in a constraint", func(p *handoffv1.HandoffPackage) {
			p.Constraints = []string{"no refund promises", "not 4111 1111 1111 1111"}
		}, []string{"constraints[1]"}},
		{"e-mail in the second open question, phone in the hint", func(p *handoffv1.HandoffPackage) {
			p.OpenQuestions = []string{"customer timezone unknown", "is jane@example.com hers?"}
			p.NextHint = "call +1 415 555 0134"
		}, []string{"open_questions[1]", "next_hint"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := testkit.Package(c.mod)
			ss := &hoptest.Stream{In: []proto.Message{&handoffv1.DeliverRequest{Package: p, Agent: "drafter"}}}
			h := &deliverHandler{}
			if err := validate.StreamServerInterceptor(v, validate.WithRejecter(validate.PackageAckRejecter()))(nil, ss, deliverInfo, h.handle); err != nil {
				t.Fatal(err)
			}
			if h.calls != 0 || len(ss.Sent) != 1 {
				t.Fatalf("handler calls=%d sent=%d, want one Ack and no work", h.calls, len(ss.Sent))
			}
			ack := ss.Sent[0].(*handoffv1.DeliverResponse).GetAck()
			if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
				t.Fatalf("ack = %v, want REJECTED_SCHEMA", ack)
			}
			var got []string
			for _, r := range ack.GetReasons() {
				if r.GetRule() != "pii" {
					t.Errorf("reason %v: rule %q, want pii", r, r.GetRule())
				}
				got = append(got, r.GetField())
			}
			testkit.Equal(t, got, c.fields, "reason fields")
			noValue(t, "ack", protojson.Format(ack))
		})
	}

	// The writeback's unary Write, without a rejecter: InvalidArgument naming the field.
	p := testkit.Package(func(p *handoffv1.HandoffPackage) { p.Goal = "refund " + card })
	_, calls, err := unary(t, v, handoffv1.WritebackService_Write_FullMethodName, &handoffv1.WriteRequest{Package: p, Artifact: &handoffv1.Artifact{Type: "summary_md", SchemaVersion: "summary_md.v1", Uri: "file:///data/a.md"}, Target: "ledger"})
	if calls != 0 {
		t.Fatalf("handler called %d times", calls)
	}
	fvs := violations(t, err)
	if len(fvs) != 1 || fvs[0].GetField() != "package.goal" || fvs[0].GetReason() != "PII" {
		t.Fatalf("violations = %v, want package.goal PII", fvs)
	}
	noValue(t, "error", status.Convert(err).Message())
	noValue(t, "detail", fvs[0].GetDescription())
}

func noValue(t *testing.T, what, s string) {
	t.Helper()
	for _, v := range []string{card, "4111 1111", "jane@example.com", "555 0134"} {
		if strings.Contains(s, v) {
			t.Errorf("%s holds the value %q: %s", what, v, s)
		}
	}
}
