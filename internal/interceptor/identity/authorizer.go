package identity

import (
	"context"

	"google.golang.org/grpc"
)

// Authorizer is one identity check: the interceptors of a server and any in-process caller
// of its handlers (the operator page) share it, so every path to a method passes the same
// policy with the same credentials.
type Authorizer struct{ o *options }

// NewAuthorizer returns the check configured by opts. It panics on an invalid policy (see
// Policy.Validate).
func NewAuthorizer(opts ...Option) *Authorizer { return &Authorizer{o: newOptions(opts)} }

// Authorize identifies the caller of ctx (certificate, service token or operator token) and
// applies the policy to fullMethod. It returns the context with the identity.
func (a *Authorizer) Authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	return a.o.authorize(ctx, fullMethod)
}

// Allow applies the policy to fullMethod for id, an identity established by its caller
// (a signed operator session), and returns ctx carrying id.
func (a *Authorizer) Allow(ctx context.Context, id Identity, fullMethod string) (context.Context, error) {
	if err := a.o.decide(ctx, fullMethod, id, true); err != nil {
		return nil, err
	}
	return NewContext(ctx, id), nil
}

// Identified reports whether the caller of ctx (its peer and incoming metadata) proves a
// service identity: a verified client certificate or a service token that verifies.
// Operator tokens are not checked here, so their failures are counted once, by Authorize.
// The servers' load limits use it to keep anonymous callers out of the slots of identified
// ones when a call opens, before its request is read.
func (a *Authorizer) Identified(ctx context.Context) bool {
	_, found, err := a.o.identifyAs(ctx, false)
	return found && err == nil
}

// Operators returns the operator verifier (nil when operator tokens are not accepted).
func (a *Authorizer) Operators() *Operators { return a.o.operators }

// UnaryServerInterceptor is the Authorizer as a unary server interceptor.
func (a *Authorizer) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.o.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is the Authorizer as a stream server interceptor.
func (a *Authorizer) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.o.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &wrappedStream{ServerStream: ss, ctx: ctx})
	}
}
