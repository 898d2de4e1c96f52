// Package validate is the schema gate of every hop: gRPC server interceptors that check each
// request with protovalidate (contract.Validator) before any handler runs, so a malformed
// package costs no handler work.
//
// A request that carries a handoff package (a field named "package" of message type
// handoff.v1.HandoffPackage, found by reflection) also passes the contract's version gate:
// the package is checked with Validator.CheckV1 first (version gate, size cap, then its
// rules), and when the gate or the size cap refuses it, nothing else in the request is
// read. The rest of the request (agent, required_tools, ...) is then checked with
// Validator.Validate.
//
// A rejected request ends with codes.InvalidArgument, whose message lists "field: message"
// pairs and whose google.rpc.BadRequest detail has one field violation per reason (field,
// description = the reason's message, reason = the rule id in UPPER_SNAKE_CASE), unless a
// Rejecter (WithRejecter) answers it instead: PackageAckRejecter turns a bad package sent to
// AgentRunnerService Deliver or Check into a REJECTED_SCHEMA Ack.
//
// Field paths. Reasons handed to a Rejecter or to the WithOnReject hook, and those in the
// error, name fields relative to the request, with proto names: "package.job_id",
// "package.artifacts[0].uri", "package" for the package as a whole (missing, too big),
// "agent". The Ack's reasons (PackageAckRejecter) name fields relative to the package, as
// handoff.v1.Reason requires: "job_id", "artifacts[0].uri", "" for the whole package.
//
// A validation that cannot run (protovalidate compilation or runtime error) is codes.Internal:
// it is no verdict on the request, and the request is not let through either.
//
// Personal data. A valid package whose free text (goal, constraints, open_questions,
// next_hint) holds an e-mail address, a phone number or a payment card number (package pii)
// is rejected too, one reason per field with rule "pii" ("package.goal"), the message naming
// the kind of data and never the value: the coordinator keeps it out by its pipeline's
// policy, and a receiver fails closed when some still arrives.
//
// Chain order: install these interceptors before (outside of) every interceptor that reads
// the package (budget, idempotency), so those only ever see schema-valid packages.
package validate

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/pii"
)

// builtin is the pii check every receiver runs: the built-in detectors (a pipeline's own
// patterns are the coordinator's business, applied before it sends).
var builtin = pii.Builtin()

// RulePackageOne is the id of the request rule "exactly one of package and package_v2"
// (DeliverRequest, CheckRequest).
const RulePackageOne = "package.one"

// maxListed caps the "field: message" pairs in an InvalidArgument message; the BadRequest
// detail carries all of them.
const maxListed = 16

// UnaryServerInterceptor validates every unary request before the handler runs: a request
// that fails Validator.Validate (and, when it carries a handoff package, Validator.CheckV1)
// ends with codes.InvalidArgument, or with the response of the Rejecter when one is set and
// answers it. The handler is not called for a rejected request. A request that is not a
// protobuf message is refused (codes.Internal): it cannot be checked.
func UnaryServerInterceptor(v *contract.Validator, opts ...Option) grpc.UnaryServerInterceptor {
	if v == nil {
		panic("validate: UnaryServerInterceptor: nil Validator")
	}
	o := newOptions(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "validate: %s: request %T is not a protobuf message", info.FullMethod, req)
		}
		reasons, err := check(v, m)
		if err != nil {
			return nil, err
		}
		if len(reasons) == 0 {
			return handler(ctx, req)
		}
		if resp, ok := o.Reject(info.FullMethod, m, reasons); ok {
			return resp, nil
		}
		return nil, InvalidArgument(reasons)
	}
}

// StreamServerInterceptor validates the requests of streaming methods.
//
// For a method configured with WithStreamRequest (AgentRunnerService/Deliver by default) the
// interceptor receives the request itself (hop.Receive: ss.RecvMsg into a new request
// message, or by reference from an earlier interceptor that holds it) and checks it before
// the handler runs. A rejected request is answered without calling the handler:
// with one SendMsg of the Rejecter's response and a nil error, or with InvalidArgument. A
// valid request is handed to the handler through a wrapped stream whose first RecvMsg
// returns it (proto.Merge into the handler's message); for a server-streaming method every
// later RecvMsg returns io.EOF, for a client-streaming one it receives from the real stream
// and validates each message as below.
//
// Any other streaming method is validated message by message as the handler receives them:
// RecvMsg returns InvalidArgument for a message that fails validation (the Rejecter is not
// used: the handler is already running).
func StreamServerInterceptor(v *contract.Validator, opts ...Option) grpc.StreamServerInterceptor {
	if v == nil {
		panic("validate: StreamServerInterceptor: nil Validator")
	}
	o := newOptions(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		newReq, ok := o.streamReqs[info.FullMethod]
		if !ok {
			return handler(srv, &checkedStream{ServerStream: ss, v: v, o: o, method: info.FullMethod})
		}
		// An interceptor before this one (the runner's version gate) may hold the request
		// already: take it by reference rather than copy the package once more.
		req, err := hop.Receive(ss, newReq())
		if err != nil {
			return err
		}
		reasons, err := check(v, req)
		if err != nil {
			return err
		}
		if len(reasons) > 0 {
			if resp, ok := o.Reject(info.FullMethod, req, reasons); ok {
				return ss.SendMsg(resp)
			}
			return InvalidArgument(reasons)
		}
		rs := hop.NewReplayStream(ss, req, "validate")
		if info.IsClientStream {
			rs.Rest = &checkedStream{ServerStream: ss, v: v, o: o, method: info.FullMethod}
		}
		return handler(srv, rs)
	}
}

// checkedStream validates every message the handler receives.
type checkedStream struct {
	grpc.ServerStream
	v      *contract.Validator
	o      *options
	method string
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "validate: %s: message %T is not a protobuf message", s.method, m)
	}
	reasons, err := check(s.v, pm)
	if err != nil {
		return err
	}
	if len(reasons) > 0 {
		if s.o.OnReject != nil {
			s.o.OnReject(s.method, reasons)
		}
		return InvalidArgument(reasons)
	}
	return nil
}

// check returns the violations of m, field paths relative to m; an error (a gRPC status)
// when validation could not run.
func check(v *contract.Validator, m proto.Message) ([]*handoffv1.Reason, error) {
	r := m.ProtoReflect()
	fd := hop.PackageField(r.Descriptor())
	var out []*handoffv1.Reason
	pkgChecked := false
	if fd != nil && r.Has(fd) {
		pkg, err := hop.AsPackage(r.Get(fd).Message())
		if err != nil {
			return nil, status.Errorf(codes.Internal, "validate: reading the package: %v", err)
		}
		pr := v.CheckV1(pkg)
		for _, x := range pr {
			if x.GetRule() == contract.RuleValidateError {
				return nil, status.Errorf(codes.Internal, "package validation could not run: %s", x.GetMessage())
			}
			out = append(out, hop.Under(string(fd.Name()), x))
		}
		if stopsAtGate(pr) {
			// The version is not one this consumer reads, or the package is over the size
			// cap: nothing else is interpreted.
			return out, nil
		}
		// Personal data that reached a receiver got past the coordinator's pii policy (or
		// was never sent by it): refuse it here too, naming the field, never the value.
		out = append(out, pii.Reasons(string(fd.Name()), builtin.Scan(pkg))...)
		pkgChecked = true
	}
	var err error
	if pkgChecked {
		// The package was just checked whole; validating the request with it inside would
		// check it a second time (a third of a hop's validation cost). Validate the rest of
		// the request without the package's rules.
		err = v.ValidateWithout(m, fd)
	} else {
		err = v.Validate(m)
	}
	for _, x := range contract.Reasons(err) {
		if x.GetRule() == contract.RuleValidateError {
			return nil, status.Errorf(codes.Internal, "request validation could not run: %s", x.GetMessage())
		}
		if pkgChecked && inField(x.GetField(), string(fd.Name())) {
			continue // the package is there (set aside above) and CheckV1 reported its own violations
		}
		if x.GetRule() == RulePackageOne && x.GetField() == "" {
			if pkgChecked {
				continue // both package and package_v2 set: not this step's reason (the version gate answers it)
			}
			// No package of either version (a v2 one reaches this gate as its v1 view): the
			// package is missing, as the field-level rule said before package_v2 existed.
			x = &handoffv1.Reason{Field: "package", Rule: contract.RuleRequired, Message: "package is required"}
		}
		out = append(out, x)
	}
	return out, nil
}

// stopsAtGate reports whether CheckV1 stopped before the package's rules: the version gate
// or the size cap refused it (exactly one reason, from the contract itself).
func stopsAtGate(pr []*handoffv1.Reason) bool {
	if len(pr) != 1 {
		return false
	}
	switch pr[0].GetRule() {
	case contract.RuleSizeMax:
		return true
	case contract.RuleRequired, contract.RuleVersionAccepted, contract.RuleVersionMismatch:
		return pr[0].GetField() == "schema"
	}
	return false
}

// inField reports whether path is name or a path inside it.
func inField(path, name string) bool {
	return path == name || strings.HasPrefix(path, name+".")
}

// InvalidArgument is the error for a rejected request: codes.InvalidArgument whose message
// lists "field: message" pairs (at most 16, then "and N more") and whose
// google.rpc.BadRequest detail has one field violation per reason: field, description =
// message, reason = the rule id in UPPER_SNAKE_CASE ("string.pattern" -> "STRING_PATTERN").
// A reason without a field is listed as "(request)".
func InvalidArgument(reasons []*handoffv1.Reason) error {
	parts := make([]string, 0, min(len(reasons), maxListed)+1)
	fvs := make([]*errdetails.BadRequest_FieldViolation, 0, len(reasons))
	for i, r := range reasons {
		field := r.GetField()
		if i < maxListed {
			shown := field
			if shown == "" {
				shown = "(request)"
			}
			parts = append(parts, fmt.Sprintf("%s: %s", shown, r.GetMessage()))
		}
		fvs = append(fvs, &errdetails.BadRequest_FieldViolation{
			Field:       field,
			Description: r.GetMessage(),
			Reason:      ruleCode(r.GetRule()),
		})
	}
	if len(reasons) > maxListed {
		parts = append(parts, fmt.Sprintf("and %d more", len(reasons)-maxListed))
	}
	st := status.New(codes.InvalidArgument, "invalid request: "+strings.Join(parts, "; "))
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: fvs}); err == nil {
		st = d
	}
	return st.Err()
}

// ruleCode turns a rule id into the UPPER_SNAKE_CASE a google.rpc reason wants (at most 63
// characters).
func ruleCode(rule string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(rule) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := strings.Trim(b.String(), "_")
	if len(out) > 63 {
		out = out[:63]
	}
	return out
}

// PackageAckRejecter answers a rejected AgentRunnerService request with a REJECTED_SCHEMA Ack
// instead of an RPC error: Deliver gets DeliverResponse{ack} (the one message of the
// stream), Check gets CheckResponse{ack}. The Ack is contract.AckFor(package,
// REJECTED_SCHEMA, reasons...) with the reasons about the package, renamed relative to it:
// with a package these are exactly Validator.CheckV1's reasons, without one a single reason
// for the package as a whole (field "", rule "required").
//
// It declines (the caller gets InvalidArgument) for other methods and when the package is
// valid and only other request fields are not (a malformed agent or required_tools): that is
// a broken request, not a package to reject.
func PackageAckRejecter() Rejecter {
	return hop.AckRejecter(handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA, func(r *handoffv1.Reason) string {
		if r.GetRule() == contract.RuleRequired {
			return "no package: the request carries no handoff package"
		}
		return r.GetMessage()
	})
}
