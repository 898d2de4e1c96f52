package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

// (a) Every fixture gets the same verdict from protovalidate (CheckJSON) and from the
// committed JSON Schema of its version, and that verdict is the one the fixture is for.
func TestFixturesProtovalidateAndJSONSchemaAgree(t *testing.T) {
	v := newValidator(t)
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			data := readFixture(t, fx.name)
			m, reasons := v.CheckJSON(data)
			if got := len(reasons) == 0; got != fx.valid {
				t.Fatalf("CheckJSON valid=%v, want %v; reasons: %v", got, fx.valid, reasons)
			}
			if fx.valid && m == nil {
				t.Fatal("CheckJSON accepted but returned no message")
			}
			if fx.version == "" {
				// Unknown version: exactly one reason, from the gate, and every committed
				// JSON Schema rejects it through its schema const.
				if len(reasons) != 1 || reasons[0].GetField() != "schema" || reasons[0].GetRule() != RuleVersionAccepted {
					t.Fatalf("reasons = %v, want one version.accepted reason on schema", reasons)
				}
				for _, ver := range []string{V1, V2} {
					err := schemaCheck(t, ver, data)
					if err == nil {
						t.Errorf("JSON Schema %s accepted %s", ver, fx.name)
					} else if !strings.Contains(err.Error(), "/schema") {
						t.Errorf("JSON Schema %s rejected %s, but not at /schema: %v", ver, fx.name, err)
					}
				}
				return
			}
			if got := declaredVersion(data); got != fx.version {
				t.Fatalf("fixture declares %q, table says %q", got, fx.version)
			}
			err := schemaCheck(t, fx.version, data)
			if (err == nil) != fx.valid {
				t.Fatalf("JSON Schema valid=%v, protovalidate valid=%v: %v", err == nil, fx.valid, err)
			}
		})
	}
}

// The schema-valid fixtures exercise what they are named for.
func TestFixtureShapes(t *testing.T) {
	v := newValidator(t)
	decode := func(name string) *handoffv1.HandoffPackage {
		m, r := v.CheckJSON(readFixture(t, name))
		if r != nil {
			t.Fatalf("%s: %v", name, r)
		}
		return m.(*handoffv1.HandoffPackage)
	}
	valid := decode("valid.json")
	// Every field of HandoffPackage is set, so the drop test below covers all of them.
	fields := valid.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if !valid.ProtoReflect().Has(fields.Get(i)) {
			t.Errorf("valid.json does not set %s", fields.Get(i).Name())
		}
	}
	m2, r := v.CheckJSON(readFixture(t, "valid_v2.json"))
	if r != nil {
		t.Fatalf("valid_v2.json: %v", r)
	}
	fields2 := m2.ProtoReflect().Descriptor().Fields()
	for i := range fields2.Len() {
		if !m2.ProtoReflect().Has(fields2.Get(i)) {
			t.Errorf("valid_v2.json does not set %s", fields2.Get(i).Name())
		}
	}
	for _, ta := range valid.GetToolsTried() {
		if !ta.GetOk() {
			t.Errorf("valid.json: tools_tried entry %q is not ok", ta.GetName())
		}
	}
	if ev := valid.GetEvaluator(); ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_PASS || len(ev.GetFailures()) != 0 {
		t.Errorf("valid.json evaluator = %v, want PASS without failures", ev)
	}
	failed := decode("judge_failed.json")
	if ev := failed.GetEvaluator(); ev.GetLastVerdict() != handoffv1.Verdict_VERDICT_FAIL || len(ev.GetFailures()) == 0 {
		t.Errorf("judge_failed.json evaluator = %v, want FAIL with failures", ev)
	}
	empty := decode("empty_budget.json")
	if b := empty.GetBudget(); b.GetUsdRemainingMicros() != 0 || b.GetHopsRemaining() != 0 {
		t.Errorf("empty_budget.json budget = %v, want no money and no hops", b)
	}
	dup := decode("duplicate_delivery.json")
	if dup.GetJobId() == "" || dup.GetStage() == "" {
		t.Errorf("duplicate_delivery.json needs job_id and stage, the idempotency key")
	}
}

// (b) Generated chaos: drop each field path present in the valid fixtures, one at a time.
// A required field missing must be rejected by both validators, with a reason naming exactly
// that path; an optional one dropped must be accepted by both.
func TestDropEachField(t *testing.T) {
	// Where the committed JSON Schema knowingly disagrees with protovalidate. Each entry is
	// asserted as it stands, so fixing the gap fails this test and the entry gets removed.
	knownGaps := map[string]string{}
	v := newValidator(t)
	for _, tc := range []struct {
		file string
		md   protoreflect.MessageDescriptor
	}{
		{"valid.json", (&handoffv1.HandoffPackage{}).ProtoReflect().Descriptor()},
		{"valid_v2.json", (&handoffv2.HandoffPackage{}).ProtoReflect().Descriptor()},
	} {
		data := readFixture(t, tc.file)
		version := declaredVersion(data)
		paths := jsonPaths(t, data)
		if len(paths) < 20 {
			t.Fatalf("%s: only %d paths found", tc.file, len(paths))
		}
		var required, optional int
		for _, path := range paths {
			t.Run(tc.file+"/"+path, func(t *testing.T) {
				req := isRequired(t, tc.md, path)
				if req {
					required++
				} else {
					optional++
				}
				dropped := dropPath(t, data, path)
				_, reasons := v.CheckJSON(dropped)
				schemaErr := schemaCheck(t, version, dropped)
				if !req {
					if reasons != nil {
						t.Errorf("optional %s dropped: protovalidate rejected: %v", path, reasons)
					}
					if schemaErr != nil {
						t.Errorf("optional %s dropped: JSON Schema rejected: %v", path, schemaErr)
					}
					return
				}
				if len(reasons) == 0 {
					t.Errorf("required %s dropped: protovalidate accepted", path)
				}
				for _, r := range reasons {
					if r.GetField() != path || r.GetRule() != RuleRequired {
						t.Errorf("required %s dropped: reason %v, want field %q rule %q", path, r, path, RuleRequired)
					}
				}
				if gap, ok := knownGaps[path]; ok {
					if schemaErr == nil {
						t.Logf("known gap (see report): %s", gap)
					} else {
						t.Errorf("known gap %q is fixed: remove it from knownGaps", gap)
					}
					return
				}
				if schemaErr == nil {
					t.Errorf("required %s dropped: JSON Schema accepted", path)
				}
			})
		}
		t.Logf("%s: %d field paths dropped, %d required, %d optional", tc.file, len(paths), required, optional)
	}
}

var pathElem = regexp.MustCompile(`^([a-z_][a-z0-9_]*)(?:\[(\d+)\])?$`)

// isRequired classifies a JSON path of a package from the descriptors' buf.validate
// annotations: required when the field's FieldRules say required=true, or when it is the
// package's schema (which the version gate requires). A list element is never required.
func isRequired(tb testing.TB, md protoreflect.MessageDescriptor, path string) bool {
	tb.Helper()
	parts := strings.Split(path, ".")
	for i, part := range parts {
		m := pathElem.FindStringSubmatch(part)
		if m == nil {
			tb.Fatalf("bad path element %q in %s", part, path)
		}
		fd := md.Fields().ByName(protoreflect.Name(m[1]))
		if fd == nil {
			tb.Fatalf("%s: %s has no field %s", path, md.FullName(), m[1])
		}
		if i == len(parts)-1 {
			if m[2] != "" {
				return false
			}
			if fd.Name() == "schema" && strings.HasSuffix(string(md.FullName()), ".HandoffPackage") {
				return true
			}
			rules, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
			return rules.GetRequired()
		}
		md = fd.Message()
		if md == nil {
			tb.Fatalf("%s: %s is not a message", path, fd.FullName())
		}
	}
	return false
}

// jsonPaths lists every member and list element of a JSON object as a proto-name path
// ("artifacts", "artifacts[0]", "artifacts[0].uri"), sorted.
func jsonPaths(tb testing.TB, data []byte) []string {
	tb.Helper()
	var root any
	if err := json.Unmarshal(data, &root); err != nil {
		tb.Fatal(err)
	}
	var out []string
	var walk func(v any, prefix string)
	walk = func(v any, prefix string) {
		switch x := v.(type) {
		case map[string]any:
			for k, child := range x {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				out = append(out, p)
				walk(child, p)
			}
		case []any:
			for i, child := range x {
				p := fmt.Sprintf("%s[%d]", prefix, i)
				out = append(out, p)
				walk(child, p)
			}
		}
	}
	walk(root, "")
	slices.Sort(out)
	return out
}

// dropPath returns data with the member or list element at path removed.
func dropPath(tb testing.TB, data []byte, path string) []byte {
	tb.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		tb.Fatal(err)
	}
	// Split "a[0].b" into steps "a", 0, "b".
	var steps []any
	for _, part := range strings.Split(path, ".") {
		m := pathElem.FindStringSubmatch(part)
		if m == nil {
			tb.Fatalf("bad path %s", path)
		}
		steps = append(steps, m[1])
		if m[2] != "" {
			i, _ := strconv.Atoi(m[2])
			steps = append(steps, i)
		}
	}
	var del func(v any, steps []any) any
	del = func(v any, steps []any) any {
		switch s := steps[0].(type) {
		case string:
			obj := v.(map[string]any)
			if len(steps) == 1 {
				delete(obj, s)
			} else {
				obj[s] = del(obj[s], steps[1:])
			}
			return obj
		case int:
			list := v.([]any)
			if len(steps) == 1 {
				return slices.Delete(slices.Clone(list), s, s+1)
			}
			list[s] = del(list[s], steps[1:])
			return list
		}
		return v
	}
	out, err := json.Marshal(del(root, steps))
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// (c) Conversion round trips and validity under the target version.
func TestConversionRoundTrip(t *testing.T) {
	v := newValidator(t)
	deadline := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	for _, fx := range fixtures {
		if !fx.valid || fx.version != V1 {
			continue
		}
		t.Run(fx.name, func(t *testing.T) {
			m, r := v.CheckJSON(readFixture(t, fx.name))
			if r != nil {
				t.Fatal(r)
			}
			p1 := m.(*handoffv1.HandoffPackage)
			before := proto.Clone(p1)
			p2, err := V1ToV2(p1, deadline)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(p1, before) {
				t.Fatal("V1ToV2 modified its input")
			}
			if r := v.CheckV2(p2); r != nil {
				t.Fatalf("converted v2 invalid: %v", r)
			}
			if got := p2.GetBudget().GetDeadline().AsTime(); !got.Equal(deadline) {
				t.Fatalf("deadline = %v, want %v", got, deadline)
			}
			back, err := V2ToV1(p2)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, p1) {
				t.Fatalf("v1 -> v2 -> v1 differs:\n got %v\nwant %v", back, p1)
			}
		})
	}
	t.Run("valid_v2.json", func(t *testing.T) {
		m, r := v.CheckJSON(readFixture(t, "valid_v2.json"))
		if r != nil {
			t.Fatal(r)
		}
		p2 := m.(*handoffv2.HandoffPackage)
		before := proto.Clone(p2)
		p1, err := V2ToV1(p2)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(p2, before) {
			t.Fatal("V2ToV1 modified its input")
		}
		if r := v.CheckV1(p1); r != nil {
			t.Fatalf("converted v1 invalid: %v", r)
		}
		if got := p1.GetMemoryRefs(); !slices.Equal(got, []string{"customer_id:cus_9", "order:shop:ord_5521"}) {
			t.Fatalf("memory_refs = %q", got)
		}
		again, err := V1ToV2(p1, p2.GetBudget().GetDeadline().AsTime())
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(again, p2) {
			t.Fatalf("v2 -> v1 -> v2 differs:\n got %v\nwant %v", again, p2)
		}
	})
}

func TestConversionErrorsNameTheField(t *testing.T) {
	ok1 := &handoffv1.HandoffPackage{Schema: V1, JobId: "j", Budget: &handoffv1.Budget{}}
	ok2 := &handoffv2.HandoffPackage{Schema: V2, JobId: "j", Budget: &handoffv2.Budget{}}
	now := time.Now()
	for _, tc := range []struct {
		name  string
		conv  func() error
		field string
	}{
		{"zero deadline", func() error { _, err := V1ToV2(ok1, time.Time{}); return err }, "budget.deadline"},
		{"deadline out of range", func() error { _, err := V1ToV2(ok1, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)); return err }, "budget.deadline"},
		{"no budget", func() error {
			p := proto.CloneOf(ok1)
			p.Budget = nil
			_, err := V1ToV2(p, now)
			return err
		}, "budget"},
		{"memory ref without kind", func() error {
			p := proto.CloneOf(ok1)
			p.MemoryRefs = []string{"customer_id:cus_9", "cus_9"}
			_, err := V1ToV2(p, now)
			return err
		}, "memory_refs[1]"},
		{"v1 schema", func() error {
			p := proto.CloneOf(ok1)
			p.Schema = V2
			_, err := V1ToV2(p, now)
			return err
		}, "schema"},
		{"kind with colon", func() error {
			p := proto.CloneOf(ok2)
			p.MemoryRefs = []*handoffv2.MemoryRef{{Kind: "a:b", Id: "c"}}
			_, err := V2ToV1(p)
			return err
		}, "memory_refs[0].kind"},
		{"v2 schema", func() error { _, err := V2ToV1(&handoffv2.HandoffPackage{}); return err }, "schema"},
		{"nil v1", func() error { _, err := V1ToV2(nil, now); return err }, "nil"},
		{"nil v2", func() error { _, err := V2ToV1(nil); return err }, "nil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.conv()
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %s", err, tc.field)
			}
		})
	}
}

// (d) A consumer that declares one version rejects the other with one reason on schema.
func TestVersionGate(t *testing.T) {
	for _, tc := range []struct {
		accept, file, sent string
	}{
		{V1, "valid_v2.json", V2},
		{V2, "valid.json", V1},
	} {
		t.Run(tc.accept+" only", func(t *testing.T) {
			v := newValidator(t, tc.accept)
			if got := v.Accepts(); !slices.Equal(got, []string{tc.accept}) {
				t.Fatalf("Accepts() = %v", got)
			}
			m, reasons := v.CheckJSON(readFixture(t, tc.file))
			if m != nil {
				t.Errorf("message decoded for an unaccepted version: %T", m)
			}
			if len(reasons) != 1 {
				t.Fatalf("reasons = %v, want exactly one", reasons)
			}
			r := reasons[0]
			if r.GetField() != "schema" || r.GetRule() != RuleVersionAccepted ||
				!strings.Contains(r.GetMessage(), tc.sent) || !strings.Contains(r.GetMessage(), tc.accept) {
				t.Fatalf("reason = %v, want field schema, rule %s, naming %s and %s", r, RuleVersionAccepted, tc.sent, tc.accept)
			}
		})
	}
	t.Run("decoded packages", func(t *testing.T) {
		v1only := newValidator(t, V1)
		r := v1only.CheckV2(&handoffv2.HandoffPackage{Schema: V2})
		if len(r) != 1 || r[0].GetRule() != RuleVersionAccepted || r[0].GetField() != "schema" {
			t.Fatalf("CheckV2 under v1-only = %v", r)
		}
		r = v1only.CheckV1(&handoffv1.HandoffPackage{Schema: "handoff.v9", JobId: "bad id"})
		if len(r) != 1 || r[0].GetRule() != RuleVersionAccepted || !strings.Contains(r[0].GetMessage(), "handoff.v9") {
			t.Fatalf("CheckV1 of v9 = %v", r)
		}
		r = v1only.CheckV1(&handoffv1.HandoffPackage{})
		if len(r) != 1 || r[0].GetRule() != RuleRequired || r[0].GetField() != "schema" {
			t.Fatalf("CheckV1 without schema = %v", r)
		}
		both := newValidator(t)
		r = both.CheckV1(&handoffv1.HandoffPackage{Schema: V2})
		if len(r) != 1 || r[0].GetRule() != RuleVersionMismatch {
			t.Fatalf("v1 message declaring v2 = %v", r)
		}
	})
}

func TestNewValidator(t *testing.T) {
	v := newValidator(t)
	if got := v.Accepts(); !slices.Equal(got, []string{V1, V2}) {
		t.Fatalf("default Accepts() = %v", got)
	}
	v.Accepts()[0] = "mutated"
	if v.Accepts()[0] != V1 {
		t.Fatal("Accepts returns the internal slice")
	}
	if got := newValidator(t, V2, V1, V2).Accepts(); !slices.Equal(got, []string{V2, V1}) {
		t.Fatalf("Accepts() = %v, want declared order without duplicates", got)
	}
	for _, bad := range []string{"handoff.v9", "", "v1"} {
		if _, err := NewValidator(V1, bad); err == nil {
			t.Errorf("NewValidator(%q) succeeded", bad)
		}
	}
}

func TestCheckJSONRejections(t *testing.T) {
	v := newValidator(t)
	valid := readFixture(t, "valid.json")
	pad := append(bytes.TrimRight(slices.Clone(valid), "}\n"), []byte(`,"next_hint":"`+strings.Repeat("x", MaxPackageBytes)+`"}`)...)
	for _, tc := range []struct {
		name, field, rule string
		data              []byte
	}{
		{"empty", "", RuleRequired, nil},
		{"whitespace", "", RuleRequired, []byte(" \n\t")},
		{"garbage", "", RuleJSONSyntax, []byte("\x00\xff\xfe garbage")},
		{"truncated", "", RuleJSONSyntax, valid[:len(valid)/2]},
		{"array", "", RuleJSONSyntax, []byte(`[{"schema":"handoff.v1"}]`)},
		{"string", "", RuleJSONSyntax, []byte(`"handoff.v1"`)},
		{"null", "", RuleJSONSyntax, []byte(`null`)},
		{"no schema", "schema", RuleRequired, []byte(`{"job_id":"tkt_1"}`)},
		{"schema not a string", "schema", RuleJSONSyntax, []byte(`{"schema":1}`)},
		{"oversize", "", RuleSizeMax, pad},
		{"unknown top-level field", "notes", RuleJSONUnknown, bytes.Replace(valid, []byte(`"goal"`), []byte(`"notes":"x","goal"`), 1)},
		{"v1 name in v2", "tools_tried", RuleJSONUnknown, bytes.Replace(readFixture(t, "valid_v2.json"), []byte(`"tool_attempts"`), []byte(`"tools_tried"`), 1)},
		{"unknown nested field", "budget.usd_remaining", RuleJSONUnknown, bytes.Replace(valid, []byte(`"usd_remaining_micros": "1200000"`), []byte(`"usd_remaining": 1.2`), 1)},
		{"unknown field in list", "artifacts[0].url", RuleJSONUnknown, bytes.Replace(valid, []byte(`"uri"`), []byte(`"url"`), 1)},
		{"wrong type", "", RuleJSONSyntax, bytes.Replace(valid, []byte(`"revisions_remaining": 2`), []byte(`"revisions_remaining": "two"`), 1)},
		{"pattern", "job_id", "string.pattern", bytes.Replace(valid, []byte(`"tkt_18422"`), []byte(`"-tkt"`), 1)},
		{"negative money", "budget.usd_remaining_micros", "int64.gte", bytes.Replace(valid, []byte(`"1200000"`), []byte(`"-1"`), 1)},
		{"error code on ok attempt", "tools_tried[0]", "tool_attempt.error_code", bytes.Replace(valid, []byte(`"ok": true,`), []byte(`"ok": true, "error_code": "timeout",`), 1)},
		{"PASS with failures", "evaluator", "evaluator.failures", bytes.Replace(valid, []byte(`"rounds": 1`), []byte(`"rounds": 1, "failures": [{"code": "x"}]`), 1)},
		{"zero trace id", "trace.traceparent", "traceparent.nonzero", bytes.Replace(valid, []byte(`4bf92f3577b34da6a3ce929d0e0e4736`), []byte(`00000000000000000000000000000000`), 1)},
		{"bad uri", "artifacts[0].uri", "string.uri", bytes.Replace(valid, []byte(`s3://ops-handoff`), []byte(`s3://ops handoff`), 1)},
		{"memory ref", "memory_refs[0]", "string.pattern", bytes.Replace(valid, []byte(`customer_id:cus_9`), []byte(`cus_9`), 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, reasons := v.CheckJSON(tc.data)
			if len(reasons) == 0 {
				t.Fatalf("accepted %.80q", tc.data)
			}
			found := false
			for _, r := range reasons {
				if r.GetField() == tc.field && r.GetRule() == tc.rule {
					found = true
				}
				if r.GetMessage() == "" {
					t.Errorf("reason without message: %v", r)
				}
			}
			if !found {
				t.Fatalf("reasons %v lack field %q rule %q", reasons, tc.field, tc.rule)
			}
		})
	}
}

func TestReasons(t *testing.T) {
	if Reasons(nil) != nil {
		t.Fatal("Reasons(nil) != nil")
	}
	r := Reasons(errors.New("boom"))
	if len(r) != 1 || r[0].GetRule() != RuleValidateError || r[0].GetMessage() != "boom" {
		t.Fatalf("Reasons(non-validation error) = %v", r)
	}
	v := newValidator(t)
	p := &handoffv1.HandoffPackage{
		Schema: V1, JobId: "tkt_1", Stage: "draft", Goal: "g",
		Artifacts: []*handoffv1.Artifact{
			{Type: "chunks", SchemaVersion: "chunks.v1", Uri: "s3://b/k"},
			{Type: "chunks", SchemaVersion: "chunks.v1"},
		},
		Budget: &handoffv1.Budget{UsdRemainingMicros: -5},
	}
	err := v.Validate(p)
	got := map[string]string{}
	for _, r := range Reasons(err) {
		got[r.GetField()] = r.GetRule()
	}
	want := map[string]string{"artifacts[1].uri": "required", "budget.usd_remaining_micros": "int64.gte"}
	if len(got) != len(want) {
		t.Fatalf("reasons = %v, want %v", got, want)
	}
	for f, rule := range want {
		if got[f] != rule {
			t.Errorf("field %s: rule %q, want %q (all: %v)", f, got[f], rule, got)
		}
	}
	if v.Validate(nil) == nil {
		t.Error("Validate(nil) = nil")
	}
}

func TestAcks(t *testing.T) {
	v := newValidator(t)
	m, _ := v.CheckJSON(readFixture(t, "valid.json"))
	p := m.(*handoffv1.HandoffPackage)
	ack := AckFor(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED)
	want := &handoffv1.Ack{
		Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED, JobId: "tkt_18422", Stage: "draft", Schema: V1,
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	if !proto.Equal(ack, want) {
		t.Fatalf("AckFor = %v, want %v", ack, want)
	}
	if !proto.Equal(AckForMessage(p, handoffv1.AckStatus_ACK_STATUS_ACCEPTED), want) {
		t.Fatal("AckForMessage(v1) differs from AckFor")
	}
	m2, _ := v.CheckJSON(readFixture(t, "valid_v2.json"))
	want.Schema = V2
	if got := AckForMessage(m2, handoffv1.AckStatus_ACK_STATUS_ACCEPTED); !proto.Equal(got, want) {
		t.Fatalf("AckForMessage(v2) = %v, want %v", got, want)
	}
	if got := AckForMessage(nil, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, &handoffv1.Reason{Rule: "x", Message: "y"}); got.GetJobId() != "" || len(got.GetReasons()) != 1 {
		t.Fatalf("AckForMessage(nil) = %v", got)
	}
	if got := AckFor(nil, handoffv1.AckStatus_ACK_STATUS_ACCEPTED); got.GetStatus() != handoffv1.AckStatus_ACK_STATUS_ACCEPTED {
		t.Fatalf("AckFor(nil) = %v", got)
	}

	// Many reasons are cut to the Ack's cap, and every ack we build passes Ack validation.
	many := make([]*handoffv1.Reason, 100)
	for i := range many {
		many[i] = &handoffv1.Reason{Field: fmt.Sprintf("constraints[%d]", i), Rule: "string.min_len", Message: "m"}
	}
	ack = AckFor(p, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, many...)
	if n := len(ack.GetReasons()); n != 64 || ack.GetReasons()[63].GetRule() != "reasons.truncated" {
		t.Fatalf("truncated ack has %d reasons, last %v", n, ack.GetReasons()[n-1])
	}
	if len(many) != 100 || many[63].GetRule() != "string.min_len" {
		t.Fatal("AckFor modified the caller's reasons")
	}
	if err := v.Validate(ack); err != nil {
		t.Fatalf("truncated ack invalid: %v", err)
	}
	long := proto.CloneOf(p)
	long.JobId = strings.Repeat("j", 300)
	if got := AckFor(long, handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, many[0]); got.GetJobId() != "" {
		t.Fatal("an over-long job_id was copied into the Ack")
	} else if err := v.Validate(got); err != nil {
		t.Fatalf("ack invalid: %v", err)
	}
}

func TestAckJSON(t *testing.T) {
	v := newValidator(t, V1)
	for _, tc := range []struct {
		file   string
		status handoffv1.AckStatus
		schema string
	}{
		{"valid.json", handoffv1.AckStatus_ACK_STATUS_ACCEPTED, V1},
		{"unknown_version.json", handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, "handoff.v9"},
		{"valid_v2.json", handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, V2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			_, ack := v.AckJSON(readFixture(t, tc.file))
			if ack.GetStatus() != tc.status || ack.GetSchema() != tc.schema || ack.GetJobId() != "tkt_18422" || ack.GetStage() != "draft" {
				t.Fatalf("ack = %v", ack)
			}
			if err := v.Validate(ack); err != nil {
				t.Fatalf("ack invalid: %v", err)
			}
		})
	}
}

// The ack a consumer sends is itself a valid handoff.v1 Ack, and its JSON form is stable.
func TestAckJSONForm(t *testing.T) {
	v := newValidator(t)
	_, ack := v.AckJSON([]byte(`{"schema":"handoff.v1"}`))
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ack)
	if err != nil {
		t.Fatal(err)
	}
	var back handoffv1.Ack
	if err := protojson.Unmarshal(b, &back); err != nil || !proto.Equal(&back, ack) {
		t.Fatalf("ack JSON round trip: %v", err)
	}
}

// The places where the committed JSON Schema and protovalidate disagree, asserted as they
// stand (documented in doc.go). If one of them changes, this test says so and doc.go needs
// updating. Everything else must agree: see the fixture and drop tests.
func TestKnownDivergences(t *testing.T) {
	v := newValidator(t)
	valid := readFixture(t, "valid.json")
	for _, tc := range []struct {
		name         string
		data         []byte
		pvRule       string // the rule protovalidate rejects with; "" = protovalidate accepts
		schemaAccept bool
	}{
		{"CEL tool_attempt.error_code", bytes.Replace(valid, []byte(`"ok": true,`), []byte(`"ok": true, "error_code": "timeout",`), 1),
			"tool_attempt.error_code", true},
		{"CEL evaluator.failures (FAIL without failures)", bytes.Replace(valid, []byte(`"VERDICT_PASS"`), []byte(`"VERDICT_FAIL"`), 1),
			"evaluator.failures", true},
		{"CEL evaluator.failures (PASS with failures)", bytes.Replace(valid, []byte(`"rounds": 1`), []byte(`"rounds": 1, "failures": [{"code": "x"}]`), 1),
			"evaluator.failures", true},
		{"CEL traceparent.nonzero", bytes.Replace(valid, []byte(`00f067aa0ba902b7`), []byte(`0000000000000000`), 1),
			"traceparent.nonzero", true},
		{"negative int64 written as a JSON string", bytes.Replace(valid, []byte(`"1200000"`), []byte(`"-5"`), 1),
			"int64.gte", true},
		{"required field under its lowerCamelCase name", bytes.Replace(valid, []byte(`"job_id"`), []byte(`"jobId"`), 1),
			"", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, reasons := v.CheckJSON(tc.data)
			if tc.pvRule == "" && reasons != nil {
				t.Fatalf("protovalidate rejected: %v", reasons)
			}
			if tc.pvRule != "" && (len(reasons) == 0 || reasons[0].GetRule() != tc.pvRule) {
				t.Fatalf("protovalidate reasons %v, want rule %s", reasons, tc.pvRule)
			}
			err := schemaCheck(t, V1, tc.data)
			if (err == nil) != tc.schemaAccept {
				t.Fatalf("JSON Schema accept=%v, documented %v: %v", err == nil, tc.schemaAccept, err)
			}
		})
	}
}
