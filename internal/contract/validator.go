package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

// Contract versions, as they appear in a package's "schema" field.
const (
	V1 = "handoff.v1"
	V2 = "handoff.v2"
)

// MaxPackageBytes caps a package's encoded size (JSON or binary): 64 KiB. Packages carry
// refs, not payloads, so anything bigger is a transcript or a tool dump that slipped in, and
// a reader must be able to bound what it reads before it parses anything.
const MaxPackageBytes = 64 << 10

// Rule ids this package emits itself (the rest come from protovalidate: "required",
// "string.pattern", "tool_attempt.error_code", ...).
const (
	RuleRequired        = "required"           // empty input, or no/empty "schema"
	RuleVersionAccepted = "version.accepted"   // the schema names a version this consumer does not accept
	RuleVersionMismatch = "version.mismatch"   // CheckV1/CheckV2 got a package declaring the other accepted version
	RuleSizeMax         = "size.max"           // encoded package larger than MaxPackageBytes
	RuleJSONSyntax      = "json.syntax"        // not JSON, not an object, or a value of the wrong JSON type
	RuleJSONUnknown     = "json.unknown_field" // a member the contract version does not define
	RuleValidateError   = "validate.error"     // protovalidate failed to run (not a verdict on the package)
	RuleBudgetDeadline  = "budget.deadline"    // a v2 package past its budget.deadline (REJECTED_BUDGET)
)

// known lists every contract version this build can decode, in order.
var known = []string{V1, V2}

// Validator checks packages against the contract for the versions its consumer declares.
// It is safe for concurrent use. Build it once: the protovalidate rules (CEL programs) are
// compiled when it is built, not per package.
type Validator struct {
	accept []string
	pv     protovalidate.Validator
}

// NewValidator returns a Validator accepting the given versions; with no arguments it accepts
// V1 and V2. Unknown version names are an error, so a typo in a consumer's configuration fails
// at start-up instead of rejecting every package at run time.
func NewValidator(accept ...string) (*Validator, error) {
	if len(accept) == 0 {
		accept = known
	}
	var acc []string
	for _, a := range accept {
		a = strings.TrimSpace(a)
		if !slices.Contains(known, a) {
			return nil, fmt.Errorf("contract: unknown version %q (known: %s)", a, strings.Join(known, ", "))
		}
		if !slices.Contains(acc, a) {
			acc = append(acc, a)
		}
	}
	pv, err := protovalidate.New(protovalidate.WithMessages(
		&handoffv1.HandoffPackage{}, &handoffv2.HandoffPackage{}, &handoffv1.Ack{},
	))
	if err != nil {
		return nil, fmt.Errorf("contract: building protovalidate: %w", err)
	}
	return &Validator{accept: acc, pv: pv}, nil
}

// Accepts returns the versions this Validator accepts (a copy).
func (v *Validator) Accepts() []string { return slices.Clone(v.accept) }

// AcceptsVersion reports whether schema is one of the accepted versions.
func (v *Validator) AcceptsVersion(schema string) bool { return slices.Contains(v.accept, schema) }

// Validate runs protovalidate on any message (used for gRPC requests); it returns a
// *protovalidate.ValidationError when a rule is broken, another error when validation could
// not run, or nil. It does no version gating: use CheckV1/CheckV2 for packages.
func (v *Validator) Validate(m proto.Message) error {
	if m == nil {
		return errors.New("contract: nil message")
	}
	return v.pv.Validate(m)
}

// ValidateWithout is Validate of m without the rules of its own field fd (and of what fd
// holds): for a request whose package was checked apart (CheckV1), the rest of the request
// is checked without validating the package a second time and without setting it aside.
// The message's own rules (a CEL rule over fd and another field) still see fd's value.
func (v *Validator) ValidateWithout(m proto.Message, fd protoreflect.FieldDescriptor) error {
	if m == nil {
		return errors.New("contract: nil message")
	}
	return v.pv.Validate(m, protovalidate.WithFilter(skipField{m: m, fd: fd}))
}

// skipField is the protovalidate filter that leaves out the field fd of the message m.
type skipField struct {
	m  proto.Message
	fd protoreflect.FieldDescriptor
}

func (f skipField) ShouldValidate(msg protoreflect.Message, d protoreflect.Descriptor) bool {
	return d != f.fd || msg.Interface() != f.m
}

// gate is the version check every package passes before any other field is looked at: a
// consumer must not half-read a version it never agreed to. want is the version of the Go
// message the package was decoded into ("" when not yet decoded).
func (v *Validator) gate(schema, want string) []*handoffv1.Reason {
	switch {
	case schema == "":
		return []*handoffv1.Reason{{
			Field: "schema", Rule: RuleRequired,
			Message: fmt.Sprintf("schema is required: name the contract version (accepted: %s)", strings.Join(v.accept, ", ")),
		}}
	case !v.AcceptsVersion(schema):
		return []*handoffv1.Reason{VersionReason(schema, v.accept)}
	case want != "" && schema != want:
		return []*handoffv1.Reason{{
			Field: "schema", Rule: RuleVersionMismatch,
			Message: fmt.Sprintf("package declares %s but was decoded as a %s package", schema, want),
		}}
	}
	return nil
}

// VersionReason is the reason a consumer accepting the versions accept gives a package of
// version schema it does not accept: field "schema", rule "version.accepted", naming both.
func VersionReason(schema string, accept []string) *handoffv1.Reason {
	return &handoffv1.Reason{
		Field: "schema", Rule: RuleVersionAccepted,
		Message: fmt.Sprintf("schema %q is not an accepted version; this consumer accepts %s", clip(schema, 64), strings.Join(accept, ", ")),
	}
}

// Newest returns the newest version in accept this build knows ("" when none).
func Newest(accept []string) string {
	for i := len(known) - 1; i >= 0; i-- {
		if slices.Contains(accept, known[i]) {
			return known[i]
		}
	}
	return ""
}

// Known reports whether version is one this build can decode.
func Known(version string) bool { return slices.Contains(known, version) }

// CheckV1 checks a decoded handoff.v1 package: version gate, size cap, then protovalidate.
// nil means valid.
func (v *Validator) CheckV1(p *handoffv1.HandoffPackage) []*handoffv1.Reason {
	if p == nil {
		return []*handoffv1.Reason{{Rule: RuleRequired, Message: "no package"}}
	}
	return v.check(p, p.GetSchema(), V1)
}

// CheckV2 checks a decoded handoff.v2 package: version gate, size cap, then protovalidate.
// nil means valid.
func (v *Validator) CheckV2(p *handoffv2.HandoffPackage) []*handoffv1.Reason {
	if p == nil {
		return []*handoffv1.Reason{{Rule: RuleRequired, Message: "no package"}}
	}
	return v.check(p, p.GetSchema(), V2)
}

// Check dispatches a decoded *handoffv1.HandoffPackage or *handoffv2.HandoffPackage to
// CheckV1 or CheckV2. Any other message (or nil) is one "required" reason.
func (v *Validator) Check(m proto.Message) []*handoffv1.Reason {
	switch p := m.(type) {
	case *handoffv1.HandoffPackage:
		return v.CheckV1(p)
	case *handoffv2.HandoffPackage:
		return v.CheckV2(p)
	}
	return []*handoffv1.Reason{{Rule: RuleRequired, Message: fmt.Sprintf("not a handoff package: %T", m)}}
}

func (v *Validator) check(m proto.Message, schema, want string) []*handoffv1.Reason {
	if r := v.gate(schema, want); r != nil {
		return r
	}
	if n := proto.Size(m); n > MaxPackageBytes {
		return []*handoffv1.Reason{sizeReason(n)}
	}
	return Reasons(v.pv.Validate(m))
}

func sizeReason(n int) *handoffv1.Reason {
	return &handoffv1.Reason{
		Rule: RuleSizeMax,
		Message: fmt.Sprintf("package is %s, over the %d byte cap: pass artifacts and memory by reference",
			sizeText(n), MaxPackageBytes),
	}
}

func sizeText(n int) string {
	if n > MaxPackageBytes {
		return fmt.Sprintf("more than %d bytes", MaxPackageBytes)
	}
	return fmt.Sprintf("%d bytes", n)
}

// CheckJSON checks a package in its JSON form (protojson; snake_case or lowerCamelCase names):
// size cap, then the "schema" member is peeked and gated, then the body is decoded into the
// message of that version with unknown fields rejected (a misspelt or renamed field such as
// v1's tools_tried in a v2 package must not vanish silently), then validated.
//
// It returns the decoded *handoffv1.HandoffPackage or *handoffv2.HandoffPackage whenever
// decoding succeeded, even when validation then failed, so the caller can echo its job_id and
// stage in the Ack; it returns nil when the input could not be decoded (or its version was not
// accepted). The package is valid exactly when the returned reasons are empty (nil).
// It never panics on any input.
func (v *Validator) CheckJSON(data []byte) (proto.Message, []*handoffv1.Reason) {
	if len(data) > MaxPackageBytes {
		return nil, []*handoffv1.Reason{sizeReason(len(data))}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, []*handoffv1.Reason{{Rule: RuleRequired, Message: "empty input: expected a JSON handoff package"}}
	}
	schema, r := peekSchema(data)
	if r != nil {
		return nil, []*handoffv1.Reason{r}
	}
	if r := v.gate(schema, ""); r != nil {
		return nil, r
	}
	var m proto.Message
	switch schema {
	case V1:
		m = &handoffv1.HandoffPackage{}
	case V2:
		m = &handoffv2.HandoffPackage{}
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(data, m); err != nil {
		return nil, []*handoffv1.Reason{decodeReason(err, data, m.ProtoReflect().Descriptor())}
	}
	if reasons := Reasons(v.pv.Validate(m)); len(reasons) > 0 {
		return m, reasons
	}
	return m, nil
}

// peekSchema reads only the top-level "schema" member, so the version gate runs before the
// rest of the package is interpreted. A missing or null schema is "" (the gate then reports
// it as required).
func peekSchema(data []byte) (string, *handoffv1.Reason) {
	var top map[string]json.RawMessage
	err := json.Unmarshal(data, &top)
	if err == nil && top == nil {
		return "", &handoffv1.Reason{Rule: RuleJSONSyntax, Message: "a handoff package must be a JSON object, got null"}
	}
	if err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return "", &handoffv1.Reason{Rule: RuleJSONSyntax, Message: "a handoff package must be a JSON object, got a JSON " + te.Value}
		}
		return "", &handoffv1.Reason{Rule: RuleJSONSyntax, Message: "not valid JSON: " + clip(err.Error(), 200)}
	}
	raw, ok := top["schema"]
	if !ok || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &handoffv1.Reason{Field: "schema", Rule: RuleJSONSyntax, Message: "schema must be a JSON string naming the contract version"}
	}
	return s, nil
}

var unknownFieldRE = regexp.MustCompile(`unknown field "([^"]*)"`)

// decodeReason turns a protojson error into a reason. protojson's errors are untyped (and
// deliberately unstable in their prefix), so only the stable `unknown field "x"` part is
// matched, and the full path of that member is then located in the JSON itself (protojson
// names only the member, which for "budget.usd_remaining" would be ambiguous). Everything
// else is reported as a syntax/type error with protojson's message.
func decodeReason(err error, data []byte, md protoreflect.MessageDescriptor) *handoffv1.Reason {
	msg := err.Error()
	// protojson prefixes "proto:" followed by a space or a non-breaking space at random.
	msg = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(msg, "proto:"), "\u00a0"))
	if m := unknownFieldRE.FindStringSubmatch(msg); m != nil {
		field := m[1]
		if path, ok := unknownPath(data, md, ""); ok {
			field = path
		}
		return &handoffv1.Reason{
			Field: clip(field, 256), Rule: RuleJSONUnknown,
			Message: clip(fmt.Sprintf("unknown field %q: %s does not define it", field, md.ParentFile().Package()), 300),
		}
	}
	return &handoffv1.Reason{Rule: RuleJSONSyntax, Message: clip(msg, 300)}
}

// unknownPath returns the proto-name path ("budget.usd_remaining", "artifacts[1].url") of the
// first JSON member, in document order, that md does not define. ok is false when there is
// none or the JSON cannot be walked (the caller then falls back to protojson's message).
func unknownPath(data []byte, md protoreflect.MessageDescriptor, prefix string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", false
		}
		fd := md.Fields().ByName(protoreflect.Name(key))
		if fd == nil {
			fd = md.Fields().ByJSONName(key)
		}
		if fd == nil {
			return prefix + key, true
		}
		name := prefix + string(fd.Name())
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || fd.Message().FullName().Parent() == "google.protobuf" {
			continue
		}
		if !fd.IsList() {
			if p, ok := unknownPath(raw, fd.Message(), name+"."); ok {
				return p, true
			}
			continue
		}
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			continue
		}
		for i, it := range items {
			if p, ok := unknownPath(it, fd.Message(), fmt.Sprintf("%s[%d].", name, i)); ok {
				return p, true
			}
		}
	}
	return "", false
}

// Reasons converts a protovalidate error into reasons, one per violation: Field is the
// violation's field path with proto names and list indexes ("artifacts[0].uri"), Rule the
// rule id ("required", "string.pattern", "tool_attempt.error_code") and Message the
// violation's message. A message-level CEL rule names the message's own path
// ("tools_tried[0]"). A non-validation error (compilation or runtime) becomes one reason
// with rule "validate.error": it is not a verdict on the package but must still fail closed.
// nil in, nil out.
func Reasons(err error) []*handoffv1.Reason {
	if err == nil {
		return nil
	}
	var ve *protovalidate.ValidationError
	if !errors.As(err, &ve) {
		return []*handoffv1.Reason{{Rule: RuleValidateError, Message: err.Error()}}
	}
	out := make([]*handoffv1.Reason, 0, len(ve.Violations))
	for _, viol := range ve.Violations {
		if viol == nil || viol.Proto == nil {
			continue
		}
		rule := viol.Proto.GetRuleId()
		msg := viol.Proto.GetMessage()
		if msg == "" {
			msg = "violates " + rule
		}
		out = append(out, &handoffv1.Reason{
			Field:   protovalidate.FieldPathString(viol.Proto.GetField()),
			Rule:    rule,
			Message: msg,
		})
	}
	if len(out) == 0 {
		return []*handoffv1.Reason{{Rule: RuleValidateError, Message: err.Error()}}
	}
	return out
}

// clip makes s safe to put in a Reason (proto strings must be valid UTF-8) and shortens it
// to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
