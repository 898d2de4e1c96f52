package validate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/interceptor/hop/hoptest"
	"github.com/handoffhq/handoff/internal/interceptor/validate"
	"github.com/handoffhq/handoff/internal/testkit"
)

const (
	tp      = testkit.Traceparent
	deliver = handoffv1.AgentRunnerService_Deliver_FullMethodName
	check   = handoffv1.AgentRunnerService_Check_FullMethodName
)

func newValidator(t *testing.T) *contract.Validator {
	t.Helper()
	v, err := contract.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func validPackage() *handoffv1.HandoffPackage { return testkit.Package() }

// badPackage lacks job_id and has a malformed stage.
func badPackage() *handoffv1.HandoffPackage {
	p := validPackage()
	p.JobId = ""
	p.Stage = "Draft!"
	return p
}

// unary runs the interceptor on req with a counting handler.
func unary(t *testing.T, v *contract.Validator, method string, req any, opts ...validate.Option) (any, int32, error) {
	t.Helper()
	var calls atomic.Int32
	h := func(ctx context.Context, req any) (any, error) {
		calls.Add(1)
		return &handoffv1.CheckResponse{Ack: &handoffv1.Ack{Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED}}, nil
	}
	resp, err := validate.UnaryServerInterceptor(v, opts...)(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: method}, h)
	return resp, calls.Load(), err
}

// violations returns the BadRequest field violations of an InvalidArgument error.
func violations(t *testing.T, err error) []*errdetails.BadRequest_FieldViolation {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code = %v (%v), want InvalidArgument", st.Code(), err)
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			return br.GetFieldViolations()
		}
	}
	t.Fatalf("no BadRequest detail in %v", err)
	return nil
}

func fields(fvs []*errdetails.BadRequest_FieldViolation) []string {
	var out []string
	for _, f := range fvs {
		out = append(out, f.GetField())
	}
	return out
}

func TestUnaryValidCallsHandler(t *testing.T) {
	v := newValidator(t)
	resp, calls, err := unary(t, v, check, &handoffv1.CheckRequest{Package: validPackage(), Agent: "drafter"})
	if err != nil || calls != 1 || resp == nil {
		t.Fatalf("resp=%v err=%v calls=%d, want the handler's answer", resp, err, calls)
	}
}

func TestUnaryInvalidPackage(t *testing.T) {
	v := newValidator(t)
	var hooked []string
	_, calls, err := unary(t, v, check, &handoffv1.CheckRequest{Package: badPackage()},
		validate.WithOnReject(func(m string, rs []*handoffv1.Reason) {
			hooked = append(hooked, m)
			for _, r := range rs {
				hooked = append(hooked, r.GetField())
			}
		}))
	if calls != 0 {
		t.Fatalf("handler called %d times for an invalid package", calls)
	}
	fvs := violations(t, err)
	got := fields(fvs)
	for _, want := range []string{"package.job_id", "package.stage"} {
		if !slices.Contains(got, want) {
			t.Errorf("violations %v do not name %s", got, want)
		}
	}
	msg := status.Convert(err).Message()
	for _, f := range fvs {
		if f.GetDescription() == "" || !strings.Contains(msg, f.GetField()+": "+f.GetDescription()) {
			t.Errorf("message %q does not list %q: %q", msg, f.GetField(), f.GetDescription())
		}
		if f.GetField() == "package.job_id" && f.GetReason() != "REQUIRED" {
			t.Errorf("job_id reason = %q, want REQUIRED", f.GetReason())
		}
		if f.GetField() == "package.stage" && f.GetReason() != "STRING_PATTERN" {
			t.Errorf("stage reason = %q, want STRING_PATTERN", f.GetReason())
		}
	}
	if len(hooked) == 0 || hooked[0] != check || !slices.Contains(hooked, "package.job_id") {
		t.Errorf("OnReject saw %v", hooked)
	}
}

// The version gate comes first and alone: a package of an unknown version gets exactly one
// reason, even when the rest of the package and of the request are broken too.
func TestUnaryVersionGate(t *testing.T) {
	v := newValidator(t)
	p := badPackage()
	p.Schema = "handoff.v9"
	_, calls, err := unary(t, v, check, &handoffv1.CheckRequest{Package: p, Agent: "Not An Agent"})
	if calls != 0 {
		t.Fatal("handler called")
	}
	fvs := violations(t, err)
	if len(fvs) != 1 || fvs[0].GetField() != "package.schema" || fvs[0].GetReason() != "VERSION_ACCEPTED" {
		t.Fatalf("violations = %v, want one version.accepted on package.schema", fvs)
	}
	// A v2 package in a v1 request is a mismatch, also alone.
	p.Schema = contract.V2
	_, _, err = unary(t, v, check, &handoffv1.CheckRequest{Package: p})
	if fvs := violations(t, err); len(fvs) != 1 || fvs[0].GetReason() != "VERSION_MISMATCH" {
		t.Fatalf("violations = %v, want one version.mismatch", fvs)
	}
	// A validator that accepts only v2 refuses a v1 package at the gate.
	v2only, err := contract.NewValidator(contract.V2)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = unary(t, v2only, check, &handoffv1.CheckRequest{Package: validPackage()})
	if fvs := violations(t, err); len(fvs) != 1 || fvs[0].GetField() != "package.schema" {
		t.Fatalf("violations = %v, want one on package.schema", fvs)
	}
}

func TestUnaryRequestFields(t *testing.T) {
	v := newValidator(t)
	_, calls, err := unary(t, v, check, &handoffv1.CheckRequest{Package: validPackage(), Agent: "Bad Agent"})
	if calls != 0 {
		t.Fatal("handler called")
	}
	if got := fields(violations(t, err)); !slices.Equal(got, []string{"agent"}) {
		t.Fatalf("violations name %v, want [agent]", got)
	}
	// A bad package and a bad agent: both reported, the package's once (not twice, from
	// CheckV1 and from the request's own validation).
	_, _, err = unary(t, v, check, &handoffv1.CheckRequest{Package: badPackage(), Agent: "Bad Agent"})
	got := fields(violations(t, err))
	if !slices.Contains(got, "agent") || !slices.Contains(got, "package.job_id") {
		t.Fatalf("violations name %v", got)
	}
	seen := map[string]int{}
	for _, f := range got {
		seen[f]++
	}
	for f, n := range seen {
		if n > 1 {
			t.Errorf("%s reported %d times", f, n)
		}
	}
}

func TestUnaryMissingPackage(t *testing.T) {
	v := newValidator(t)
	_, calls, err := unary(t, v, check, &handoffv1.CheckRequest{})
	if calls != 0 {
		t.Fatal("handler called")
	}
	fvs := violations(t, err)
	if len(fvs) != 1 || fvs[0].GetField() != "package" || fvs[0].GetReason() != "REQUIRED" {
		t.Fatalf("violations = %v, want package required", fvs)
	}
	// An empty package is present: it fails the version gate.
	_, _, err = unary(t, v, check, &handoffv1.CheckRequest{Package: &handoffv1.HandoffPackage{}})
	if fvs := violations(t, err); len(fvs) != 1 || fvs[0].GetField() != "package.schema" {
		t.Fatalf("violations = %v, want package.schema required", fvs)
	}
}

// Requests without a package are validated with their own rules.
func TestUnaryOtherRequests(t *testing.T) {
	v := newValidator(t)
	_, calls, err := unary(t, v, handoffv1.CoordinatorService_GetJob_FullMethodName, &handoffv1.GetJobRequest{})
	if calls != 0 {
		t.Fatal("handler called")
	}
	if got := fields(violations(t, err)); !slices.Equal(got, []string{"run_id"}) {
		t.Fatalf("violations name %v", got)
	}
	if _, calls, err := unary(t, v, handoffv1.CoordinatorService_GetJob_FullMethodName, &handoffv1.GetJobRequest{RunId: "r1"}); err != nil || calls != 1 {
		t.Fatalf("valid request: err=%v calls=%d", err, calls)
	}
	// Not a protobuf message: refused, not let through.
	if _, calls, err := unary(t, v, "/x.Y/Z", "text"); status.Code(err) != codes.Internal || calls != 0 {
		t.Fatalf("non-proto request: err=%v calls=%d", err, calls)
	}
}

func TestPackageAckRejecterUnary(t *testing.T) {
	v := newValidator(t)
	opt := validate.WithRejecter(validate.PackageAckRejecter())
	p := badPackage()
	resp, calls, err := unary(t, v, check, &handoffv1.CheckRequest{Package: p}, opt)
	if err != nil || calls != 0 {
		t.Fatalf("err=%v calls=%d, want an Ack and no handler call", err, calls)
	}
	ack := resp.(*handoffv1.CheckResponse).GetAck()
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA {
		t.Fatalf("ack = %v", ack)
	}
	// The Ack's reasons are CheckV1's, relative to the package.
	want := v.CheckV1(p)
	if len(ack.GetReasons()) != len(want) {
		t.Fatalf("reasons %v, want %v", ack.GetReasons(), want)
	}
	for i := range want {
		testkit.Equal(t, ack.GetReasons()[i], want[i], fmt.Sprintf("reason %d", i))
	}
	if ack.GetSchema() != contract.V1 || ack.GetTraceparent() != tp || ack.GetWallet() != nil {
		t.Errorf("ack identity = %v", ack)
	}
	if err := v.Validate(ack); err != nil {
		t.Errorf("the Ack breaks its own rules: %v", err)
	}

	// No package: an Ack with one reason about the package as a whole.
	resp, _, err = unary(t, v, check, &handoffv1.CheckRequest{}, opt)
	if err != nil {
		t.Fatal(err)
	}
	ack = resp.(*handoffv1.CheckResponse).GetAck()
	if r := ack.GetReasons(); len(r) != 1 || r[0].GetField() != "" || r[0].GetRule() != contract.RuleRequired {
		t.Fatalf("reasons = %v", r)
	}
	if err := v.Validate(ack); err != nil {
		t.Errorf("the Ack breaks its own rules: %v", err)
	}

	// Only the agent is bad: a broken request, not a package to reject.
	_, calls, err = unary(t, v, check, &handoffv1.CheckRequest{Package: validPackage(), Agent: "Bad Agent"}, opt)
	if status.Code(err) != codes.InvalidArgument || calls != 0 {
		t.Fatalf("err=%v calls=%d, want InvalidArgument", err, calls)
	}
	// Other methods: declined.
	_, _, err = unary(t, v, handoffv1.WritebackService_Write_FullMethodName, &handoffv1.WriteRequest{Package: p}, opt)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("err=%v, want InvalidArgument", err)
	}
}

// ---- streams ----

// deliverHandler is the generated Deliver handler's shape: it receives one DeliverRequest,
// then reads once more to see the end of the stream.
type deliverHandler struct {
	calls   int
	got     *handoffv1.DeliverRequest
	nextErr error
}

func (h *deliverHandler) handle(_ any, ss grpc.ServerStream) error {
	h.calls++
	h.got = &handoffv1.DeliverRequest{}
	if err := ss.RecvMsg(h.got); err != nil {
		return err
	}
	h.nextErr = ss.RecvMsg(&handoffv1.DeliverRequest{})
	return ss.SendMsg(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{
		Ack: contract.AckFor(h.got.GetPackage(), handoffv1.AckStatus_ACK_STATUS_ACCEPTED)}})
}

var deliverInfo = &grpc.StreamServerInfo{FullMethod: deliver, IsServerStream: true}

func TestStreamValidReplaysRequest(t *testing.T) {
	v := newValidator(t)
	req := &handoffv1.DeliverRequest{Package: validPackage(), Agent: "drafter", RequiredTools: []string{"tickets.get"}}
	ss := &hoptest.Stream{In: []proto.Message{req}}
	h := &deliverHandler{}
	if err := validate.StreamServerInterceptor(v)(nil, ss, deliverInfo, h.handle); err != nil {
		t.Fatal(err)
	}
	if h.calls != 1 || !proto.Equal(h.got, req) {
		t.Fatalf("handler calls=%d got=%v", h.calls, h.got)
	}
	if h.nextErr != io.EOF {
		t.Fatalf("second RecvMsg = %v, want io.EOF", h.nextErr)
	}
	if ss.Recvs != 1 {
		t.Fatalf("the real stream was read %d times, want 1", ss.Recvs)
	}
	if len(ss.Sent) != 1 {
		t.Fatalf("sent %d messages", len(ss.Sent))
	}
}

func TestStreamInvalidNeverCallsHandler(t *testing.T) {
	v := newValidator(t)
	var rejects atomic.Int32
	onReject := validate.WithOnReject(func(string, []*handoffv1.Reason) { rejects.Add(1) })

	// Without a rejecter: InvalidArgument, nothing sent.
	ss := &hoptest.Stream{In: []proto.Message{&handoffv1.DeliverRequest{Package: badPackage()}}}
	h := &deliverHandler{}
	err := validate.StreamServerInterceptor(v, onReject)(nil, ss, deliverInfo, h.handle)
	if got := fields(violations(t, err)); !slices.Contains(got, "package.job_id") {
		t.Fatalf("violations %v", got)
	}
	if h.calls != 0 || len(ss.Sent) != 0 {
		t.Fatalf("handler calls=%d sent=%d", h.calls, len(ss.Sent))
	}

	// With PackageAckRejecter: one REJECTED_SCHEMA Ack, the call ends OK.
	ss = &hoptest.Stream{In: []proto.Message{&handoffv1.DeliverRequest{Package: badPackage()}}}
	err = validate.StreamServerInterceptor(v, onReject, validate.WithRejecter(validate.PackageAckRejecter()))(nil, ss, deliverInfo, h.handle)
	if err != nil || h.calls != 0 || len(ss.Sent) != 1 {
		t.Fatalf("err=%v handler calls=%d sent=%d", err, h.calls, len(ss.Sent))
	}
	ack := ss.Sent[0].(*handoffv1.DeliverResponse).GetAck()
	if ack.GetStatus() != handoffv1.AckStatus_ACK_STATUS_REJECTED_SCHEMA || ack.GetSchema() != contract.V1 {
		t.Fatalf("ack = %v", ack)
	}
	var names []string
	for _, r := range ack.GetReasons() {
		names = append(names, r.GetField())
	}
	if !slices.Contains(names, "job_id") || !slices.Contains(names, "stage") {
		t.Fatalf("ack reasons name %v", names)
	}
	if rejects.Load() != 2 {
		t.Fatalf("OnReject called %d times, want 2", rejects.Load())
	}
}

func TestStreamRecvError(t *testing.T) {
	v := newValidator(t)
	boom := status.Error(codes.Canceled, "gone")
	ss := &hoptest.Stream{Err: boom}
	h := &deliverHandler{}
	if err := validate.StreamServerInterceptor(v)(nil, ss, deliverInfo, h.handle); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if h.calls != 0 {
		t.Fatal("handler called")
	}
}

// Streams not configured with WithStreamRequest are validated as the handler receives.
func TestStreamUnconfiguredValidatesOnRecv(t *testing.T) {
	v := newValidator(t)
	info := &grpc.StreamServerInfo{FullMethod: handoffv1.CoordinatorService_WatchJob_FullMethodName, IsServerStream: true}
	var recvErr error
	calls := 0
	h := func(_ any, ss grpc.ServerStream) error {
		calls++
		recvErr = ss.RecvMsg(&handoffv1.WatchJobRequest{})
		return recvErr
	}
	ss := &hoptest.Stream{In: []proto.Message{&handoffv1.WatchJobRequest{}}}
	err := validate.StreamServerInterceptor(v)(nil, ss, info, h)
	if got := fields(violations(t, err)); !slices.Equal(got, []string{"run_id"}) || calls != 1 {
		t.Fatalf("violations %v, calls %d", got, calls)
	}
	ss = &hoptest.Stream{In: []proto.Message{&handoffv1.WatchJobRequest{RunId: "r1"}}}
	if err := validate.StreamServerInterceptor(v)(nil, ss, info, h); err != nil {
		t.Fatal(err)
	}
}

// A configured client-streaming method: the first message is replayed, the next ones are
// read from the real stream and validated.
func TestStreamClientStreamingRest(t *testing.T) {
	v := newValidator(t)
	method := handoffv1.CoordinatorService_WatchJob_FullMethodName
	info := &grpc.StreamServerInfo{FullMethod: method, IsClientStream: true, IsServerStream: true}
	ss := &hoptest.Stream{In: []proto.Message{&handoffv1.WatchJobRequest{RunId: "a"}, &handoffv1.WatchJobRequest{RunId: "b"}, &handoffv1.WatchJobRequest{}}}
	var got []string
	var last error
	h := func(_ any, ss grpc.ServerStream) error {
		for {
			m := &handoffv1.WatchJobRequest{}
			if last = ss.RecvMsg(m); last != nil {
				return last
			}
			got = append(got, m.GetRunId())
		}
	}
	err := validate.StreamServerInterceptor(v, validate.WithStreamRequest(method, nil))(nil, ss, info, h)
	if !slices.Equal(got, []string{"a", "b"}) || status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, err %v", got, err)
	}
}

func TestWithStreamRequestMisconfigured(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	mustPanic("wrong type", func() {
		validate.WithStreamRequest(deliver, func() proto.Message { return &handoffv1.CheckRequest{} })
	})
	mustPanic("malformed name", func() { validate.WithStreamRequest("Deliver", nil) })
	mustPanic("unknown method, no factory", func() { validate.WithStreamRequest("/x.Y/Z", nil) })
	// Unknown to the registry but with a factory: accepted.
	validate.WithStreamRequest("/x.Y/Z", func() proto.Message { return &handoffv1.DeliverRequest{} })
}

func TestInvalidArgumentCapsTheMessage(t *testing.T) {
	var rs []*handoffv1.Reason
	for range 20 {
		rs = append(rs, &handoffv1.Reason{Field: "f", Rule: "string.max_len", Message: "too long"})
	}
	err := validate.InvalidArgument(rs)
	if !strings.Contains(status.Convert(err).Message(), "and 4 more") {
		t.Fatalf("message %q", status.Convert(err).Message())
	}
	if n := len(violations(t, err)); n != 20 {
		t.Fatalf("%d violations in the detail, want all 20", n)
	}
}

// TestStreamTakesTheHeldRequest: behind an interceptor that already received the request (a
// hop.ReplayStream, as the runner's version gate hands on), validate checks that very
// message, without reading the stream again or copying the package, and hands it on by
// reference; an invalid held request is still rejected.
func TestStreamTakesTheHeldRequest(t *testing.T) {
	v := newValidator(t)
	req := &handoffv1.DeliverRequest{Package: validPackage(), Agent: "drafter"}
	ss := &hoptest.Stream{}
	var got proto.Message
	next := func(_ any, s grpc.ServerStream) error {
		m, err := hop.Receive(s, &handoffv1.DeliverRequest{})
		got = m
		return err
	}
	if err := validate.StreamServerInterceptor(v)(nil, hop.NewReplayStream(ss, req, "outer"), deliverInfo, next); err != nil {
		t.Fatal(err)
	}
	if got != proto.Message(req) {
		t.Fatalf("the next interceptor got %p, want the held request %p itself", got, req)
	}
	if ss.Recvs != 0 {
		t.Fatalf("the real stream was read %d times, want 0", ss.Recvs)
	}

	bad := &handoffv1.DeliverRequest{Package: badPackage()}
	calls := 0
	err := validate.StreamServerInterceptor(v)(nil, hop.NewReplayStream(ss, bad, "outer"), deliverInfo, func(any, grpc.ServerStream) error {
		calls++
		return nil
	})
	if status.Code(err) != codes.InvalidArgument || calls != 0 {
		t.Fatalf("held invalid request: err=%v calls=%d, want InvalidArgument and no handler", err, calls)
	}
	if !proto.Equal(bad.GetPackage(), badPackage()) {
		t.Fatal("validating the held request changed it")
	}
}
