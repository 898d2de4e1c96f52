package validate

import (
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
)

// Rejecter answers a rejected request with a response instead of an RPC error. reasons are
// the request's violations with field paths relative to the request ("package.job_id",
// "agent"; see UnaryServerInterceptor). ok=false (or a nil resp) declines: the caller then
// gets the InvalidArgument error. It is an alias of hop.Rejecter, as budget.Rejecter is, so
// that a function of this shape can be passed to any interceptor package that takes one.
type Rejecter = hop.Rejecter

// Option configures UnaryServerInterceptor and StreamServerInterceptor.
type Option func(*options)

type options struct {
	streamReqs map[string]func() proto.Message
	hop.Rejection
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
	newReq = hop.MessageFactory("validate", "WithStreamRequest", fullMethod, newReq)
	return func(o *options) { o.streamReqs[fullMethod] = newReq }
}

// WithRejecter sets the function that may answer a rejected request with a response (an Ack)
// instead of the InvalidArgument error; see Rejecter and PackageAckRejecter. Unary: the
// response is returned with a nil error. Stream: it is sent as the one message of the stream
// and the call ends OK. It is not used for messages rejected mid-stream (after the handler
// started), which always end with InvalidArgument.
func WithRejecter(r Rejecter) Option {
	return func(o *options) { o.Rejecter = r }
}

// WithOnReject sets a hook called once per rejected request or stream message (before the
// rejecter), for metrics and logging. reasons are as the Rejecter gets them; the hook must not
// modify them.
func WithOnReject(fn func(fullMethod string, reasons []*handoffv1.Reason)) Option {
	return func(o *options) { o.OnReject = fn }
}
