package budget

import (
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
)

// Rejecter answers a budget rejection with a response (a REJECTED_BUDGET Ack) instead of an
// RPC error. reasons name fields relative to the request ("package.budget.hops_remaining").
// ok=false (or a nil resp) declines: the caller then gets codes.ResourceExhausted. It is an
// alias of hop.Rejecter, as validate.Rejecter is, so one function can serve both.
type Rejecter = hop.Rejecter

// Option configures UnaryServerInterceptor and StreamServerInterceptor.
type Option func(*options)

type options struct {
	streamReqs map[string]func() proto.Message
	debit      map[string]bool
	hop.Rejection
}

func newOptions(opts []Option) *options {
	o := &options{
		streamReqs: map[string]func() proto.Message{
			handoffv1.AgentRunnerService_Deliver_FullMethodName: func() proto.Message { return &handoffv1.DeliverRequest{} },
		},
		debit:     map[string]bool{handoffv1.AgentRunnerService_Deliver_FullMethodName: true},
		Rejection: hop.Rejection{Rejecter: PackageAckRejecter()},
	}
	for _, f := range opts {
		if f != nil {
			f(o)
		}
	}
	return o
}

// WithStreamRequest tells StreamServerInterceptor the request type of the streaming method
// fullMethod, so that it receives the request itself and checks (and debits) its package
// before the handler runs. It is meant for methods whose client sends one message
// (server-streaming). newReq returns an empty request message; nil looks the method's input
// type up in the global protobuf registry. It panics on a malformed method name, when newReq
// is nil and the method is not registered, or when newReq makes another type than the
// registered input.
//
// AgentRunnerService/Deliver is configured by default. A streaming method that is not
// configured is passed through, except that a message carrying a handoff package fails
// RecvMsg with codes.Internal: the interceptor never lets a package through unchecked.
func WithStreamRequest(fullMethod string, newReq func() proto.Message) Option {
	newReq = hop.MessageFactory("budget", "WithStreamRequest", fullMethod, newReq)
	return func(o *options) { o.streamReqs[fullMethod] = newReq }
}

// WithDebitMethods sets the methods (full names) whose packages debit one hop from their
// wallet; it replaces the default, "/handoff.v1.AgentRunnerService/Deliver" (the last call
// wins; no names means no method debits). Every other method that carries a package only
// checks the numbers: the stored wallet's when it is in the store, else the package's. So
// AgentRunnerService/Check answers what Deliver would, without taking anything.
func WithDebitMethods(fullMethods ...string) Option {
	for _, m := range fullMethods {
		hop.Site{Pkg: "budget", Opt: "WithDebitMethods", FullMethod: m}.MethodName()
	}
	return func(o *options) {
		o.debit = make(map[string]bool, len(fullMethods))
		for _, m := range fullMethods {
			o.debit[m] = true
		}
	}
}

// WithRejecter sets the function that answers a budget rejection; default
// PackageAckRejecter() (REJECTED_BUDGET Acks for AgentRunnerService Deliver and Check,
// codes.ResourceExhausted for other methods). nil means every rejection is
// codes.ResourceExhausted.
func WithRejecter(r Rejecter) Option {
	return func(o *options) { o.Rejecter = r }
}

// WithOnReject sets a hook called once per budget rejection (before the rejecter), for metrics
// and logging. reasons are as the Rejecter gets them; the hook must not modify them.
func WithOnReject(fn func(fullMethod string, reasons []*handoffv1.Reason)) Option {
	return func(o *options) { o.OnReject = fn }
}
