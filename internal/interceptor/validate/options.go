package validate

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// Rejecter answers a rejected request with a response instead of an RPC error. reasons are
// the request's violations with field paths relative to the request ("package.job_id",
// "agent"; see UnaryServerInterceptor). ok=false (or a nil resp) declines: the caller then
// gets the InvalidArgument error. It is a type alias so that a function of this shape can be
// passed to any interceptor package that takes one (budget.Rejecter has the same shape).
type Rejecter = func(fullMethod string, req proto.Message, reasons []*handoffv1.Reason) (resp proto.Message, ok bool)

// Option configures UnaryServerInterceptor and StreamServerInterceptor.
type Option func(*options)

type options struct {
	streamReqs map[string]func() proto.Message
	rejecter   Rejecter
	onReject   func(fullMethod string, reasons []*handoffv1.Reason)
}

func newOptions(opts []Option) *options {
	o := &options{streamReqs: map[string]func() proto.Message{
		handoffv1.AgentRunnerService_Deliver_FullMethodName: func() proto.Message { return &handoffv1.DeliverRequest{} },
	}}
	for _, f := range opts {
		if f != nil {
			f(o)
		}
	}
	return o
}

// WithStreamRequest tells StreamServerInterceptor the request type of the streaming method
// fullMethod ("/handoff.v1.AgentRunnerService/Deliver"), so that it can receive and check the
// request itself, before the handler runs, and answer a bad one without calling the handler.
// It is meant for methods whose client sends one message (server-streaming).
//
// newReq returns an empty request message; nil looks the method's input type up in the
// global protobuf registry. It panics on a malformed method name, when newReq is nil and the
// method is not registered, or when newReq makes another type than the registered input.
//
// AgentRunnerService/Deliver is configured by default. Streaming methods not configured are
// still validated, message by message, as the handler receives them (see
// StreamServerInterceptor), but a rejection is then an RPC error from RecvMsg.
func WithStreamRequest(fullMethod string, newReq func() proto.Message) Option {
	newReq = messageFactory("WithStreamRequest", fullMethod, newReq)
	return func(o *options) { o.streamReqs[fullMethod] = newReq }
}

// WithRejecter sets the function that may answer a rejected request with a response (an Ack)
// instead of the InvalidArgument error; see Rejecter and PackageAckRejecter. Unary: the
// response is returned with a nil error. Stream: it is sent as the one message of the stream
// and the call ends OK. It is not used for messages rejected mid-stream (after the handler
// started), which always end with InvalidArgument.
func WithRejecter(r Rejecter) Option {
	return func(o *options) { o.rejecter = r }
}

// WithOnReject sets a hook called once per rejected request or stream message (before the
// rejecter), for metrics and logging. reasons are as the Rejecter gets them; the hook must not
// modify them.
func WithOnReject(fn func(fullMethod string, reasons []*handoffv1.Reason)) Option {
	return func(o *options) { o.onReject = fn }
}

// messageFactory returns newMsg, or when it is nil a factory for the registered input type of
// fullMethod. It panics when neither is available or newMsg makes another type than the
// method's input.
func messageFactory(opt, fullMethod string, newMsg func() proto.Message) func() proto.Message {
	svc, name, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok || !strings.HasPrefix(fullMethod, "/") || svc == "" || name == "" || strings.Contains(name, "/") {
		panic(fmt.Sprintf("validate: %s(%q): want a full method name \"/package.Service/Method\"", opt, fullMethod))
	}
	var in protoreflect.MessageDescriptor
	if d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc)); err == nil {
		if sd, ok := d.(protoreflect.ServiceDescriptor); ok {
			if md := sd.Methods().ByName(protoreflect.Name(name)); md != nil {
				in = md.Input()
			}
		}
	}
	switch {
	case in == nil && newMsg == nil:
		panic(fmt.Sprintf("validate: %s(%q): newReq is nil and the method is not in the protobuf registry", opt, fullMethod))
	case in == nil:
		return newMsg
	case newMsg == nil:
		mt, err := protoregistry.GlobalTypes.FindMessageByName(in.FullName())
		if err != nil {
			panic(fmt.Sprintf("validate: %s(%q): newReq is nil and %s has no registered Go type", opt, fullMethod, in.FullName()))
		}
		return func() proto.Message { return mt.New().Interface() }
	}
	if got := newMsg().ProtoReflect().Descriptor().FullName(); got != in.FullName() {
		panic(fmt.Sprintf("validate: %s(%q): newReq makes %s, the method's input is %s", opt, fullMethod, got, in.FullName()))
	}
	return newMsg
}
