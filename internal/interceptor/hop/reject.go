package hop

import (
	"strings"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
)

// Rejecter answers a rejected request with a response (an Ack) instead of an RPC error.
// reasons name fields relative to the request ("package.job_id"). ok=false (or a nil resp)
// declines: the caller then gets the interceptor's RPC error. validate.Rejecter and
// budget.Rejecter are aliases of it, so one function can serve both.
type Rejecter = func(fullMethod string, req proto.Message, reasons []*handoffv1.Reason) (resp proto.Message, ok bool)

// Rejection is how an interceptor answers a rejection: a hook told of each one and a
// Rejecter that may answer it.
type Rejection struct {
	Rejecter Rejecter                                             // nil: every rejection is an RPC error
	OnReject func(fullMethod string, reasons []*handoffv1.Reason) // nil: no hook
}

// Reject calls OnReject, then Rejecter (each when set); ok reports that resp answers the
// request (a Rejecter that returns ok with a nil resp declines).
func (r *Rejection) Reject(fullMethod string, req proto.Message, reasons []*handoffv1.Reason) (proto.Message, bool) {
	if r.OnReject != nil {
		r.OnReject(fullMethod, reasons)
	}
	if r.Rejecter == nil {
		return nil, false
	}
	resp, ok := r.Rejecter(fullMethod, req, reasons)
	return resp, ok && resp != nil
}

// AckResponse wraps ack in the response of fullMethod: DeliverResponse{ack} for
// AgentRunnerService/Deliver (the one message of the stream), CheckResponse{ack} for
// AgentRunnerService/Check. ok is false for any other method.
func AckResponse(fullMethod string, ack *handoffv1.Ack) (resp proto.Message, ok bool) {
	switch fullMethod {
	case handoffv1.AgentRunnerService_Deliver_FullMethodName:
		return &handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: ack}}, true
	case handoffv1.AgentRunnerService_Check_FullMethodName:
		return &handoffv1.CheckResponse{Ack: ack}, true
	}
	return nil, false
}

// packageCarrier is a request with a generated GetPackage (DeliverRequest, CheckRequest).
type packageCarrier interface {
	GetPackage() *handoffv1.HandoffPackage
}

// AckRejecter returns a Rejecter that answers a rejection of AgentRunnerService Deliver or
// Check with an Ack of status st (see AckResponse): contract.AckFor(the request's package, st,
// reasons...) with the reasons about the package renamed relative to it ("package.job_id"
// becomes "job_id", "package" becomes ""); reasons about other request fields are left out.
// whole, when not nil, gives the message of a reason about the package as a whole (field
// "package"); nil keeps the reason's own. It declines for other methods and when no reason
// is about the package.
func AckRejecter(st handoffv1.AckStatus, whole func(r *handoffv1.Reason) string) Rejecter {
	return func(fullMethod string, req proto.Message, reasons []*handoffv1.Reason) (proto.Message, bool) {
		if fullMethod != handoffv1.AgentRunnerService_Deliver_FullMethodName && fullMethod != handoffv1.AgentRunnerService_Check_FullMethodName {
			return nil, false
		}
		var pr []*handoffv1.Reason
		for _, r := range reasons {
			switch f := r.GetField(); {
			case f == "package":
				msg := r.GetMessage()
				if whole != nil {
					msg = whole(r)
				}
				pr = append(pr, &handoffv1.Reason{Rule: r.GetRule(), Message: msg})
			case strings.HasPrefix(f, "package."):
				pr = append(pr, &handoffv1.Reason{Field: strings.TrimPrefix(f, "package."), Rule: r.GetRule(), Message: r.GetMessage()})
			}
		}
		if len(pr) == 0 {
			return nil, false
		}
		var pkg *handoffv1.HandoffPackage
		if g, ok := req.(packageCarrier); ok {
			pkg = g.GetPackage()
		}
		return AckResponse(fullMethod, contract.AckFor(pkg, st, pr...))
	}
}
