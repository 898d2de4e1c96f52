package contract

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// FuzzDecodeValidate feeds arbitrary bytes to the JSON and binary entry points. Properties:
// nothing panics; CheckJSON (through AckJSON) returns a message with no reasons, or reasons; an accepted package
// re-marshalled by protojson is accepted again and decodes to the same message; the Ack built
// for any input is itself a valid Ack; a binary v1 package can be checked and converted.
func FuzzDecodeValidate(f *testing.F) {
	for _, fx := range fixtures {
		f.Add(readFixture(f, fx.name))
	}
	f.Add([]byte(""))
	f.Add([]byte("{}"))
	f.Add([]byte(`{"schema":"handoff.v1","budget":{"usd_remaining":1.2}}`))
	v := newValidator(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		// AckJSON is CheckJSON plus the Ack; one call keeps the fuzzer fast.
		m, ack := v.AckJSON(data)
		reasons := ack.GetReasons()
		switch ack.GetStatus() {
		case handoffv1.AckStatus_ACK_STATUS_ACCEPTED:
			if m == nil || len(reasons) != 0 {
				t.Fatalf("accepted with message %v and reasons %v", m, reasons)
			}
		case handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA:
			if len(reasons) == 0 {
				t.Fatal("rejected without reasons")
			}
		default:
			t.Fatalf("ack status %v", ack.GetStatus())
		}
		for _, r := range reasons {
			if r == nil || r.GetRule() == "" || r.GetMessage() == "" {
				t.Fatalf("incomplete reason %v", r)
			}
		}
		if err := v.Validate(ack); err != nil {
			t.Fatalf("ack for %q is not a valid Ack: %v\n%v", data, err, ack)
		}
		if _, err := proto.Marshal(ack); err != nil {
			t.Fatalf("ack does not marshal: %v", err)
		}
		if len(reasons) == 0 {
			out, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
			if err != nil {
				t.Fatalf("accepted package does not re-marshal: %v", err)
			}
			// The cap is on the bytes received; the canonical form may be longer than a
			// compact input (quoted int64, enum names), so only re-check what fits.
			if len(out) <= MaxPackageBytes {
				m2, r2 := v.CheckJSON(out)
				if r2 != nil {
					t.Fatalf("accepted package rejected after a round trip: %v\nin:  %q\nout: %s", r2, data, out)
				}
				if !proto.Equal(m, m2) {
					t.Fatalf("round trip changed the package:\n%v\n%v", m, m2)
				}
			}
		}

		var p handoffv1.HandoffPackage
		if proto.Unmarshal(data, &p) == nil {
			_ = v.CheckV1(&p)
			_ = AckFor(&p, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA)
			if p2, err := V1ToV2(&p, time.Unix(1800000000, 0)); err == nil {
				_ = v.CheckV2(p2)
				_, _ = V2ToV1(p2)
			}
		}
	})
}

func BenchmarkCheckJSON(b *testing.B) {
	v := newValidator(b)
	data := readFixture(b, "valid.json")
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, r := v.CheckJSON(data); r != nil {
			b.Fatal(r)
		}
	}
}
