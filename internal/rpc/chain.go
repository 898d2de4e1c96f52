package rpc

import (
	"reflect"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
)

// streamChain runs stream interceptors in order, as grpc.ChainStreamInterceptor does, but
// builds the handlers linking them once per method instead of once per call: grpc's chain
// makes a closure per interceptor on every call (a dozen on every hop of the runner's
// chain). The handlers of a method capture its StreamServerInfo and final handler, which
// gRPC gives every call of a registered method alike (its StreamDesc's handler). Only the
// registered methods are kept: calls of any other name (an unknown-service handler's) are
// chained per call, so callers cannot grow the table.
type streamChain struct {
	ints   []grpc.StreamServerInterceptor
	server atomic.Pointer[grpc.Server] // set once NewServer made it

	once    sync.Once
	methods map[string]bool // the registered stream methods, read at the first call

	chains sync.Map // full method name → *methodChain
}

type methodChain struct {
	info  *grpc.StreamServerInfo
	final uintptr            // the final handler's code pointer, to check it is the same
	next  grpc.StreamHandler // what ints[0] calls: ints[1] with the handler after it, ...
}

func newStreamChain(ints []grpc.StreamServerInterceptor) *streamChain {
	return &streamChain{ints: ints}
}

// intercept is the chain as one grpc.StreamServerInterceptor.
func (c *streamChain) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if len(c.ints) == 0 {
		return handler(srv, ss)
	}
	if mc := c.method(info, handler); mc != nil {
		return c.ints[0](srv, ss, mc.info, mc.next)
	}
	return c.ints[0](srv, ss, info, c.link(info, handler))
}

// method returns the kept chain of info's method for handler; nil when the method is not a
// registered one (or handler is not the one its chain was built for).
func (c *streamChain) method(info *grpc.StreamServerInfo, handler grpc.StreamHandler) *methodChain {
	final := reflect.ValueOf(handler).Pointer()
	if v, ok := c.chains.Load(info.FullMethod); ok {
		if mc := v.(*methodChain); mc.final == final {
			return mc
		}
		return nil
	}
	if !c.registered(info.FullMethod) {
		return nil
	}
	kept := &grpc.StreamServerInfo{FullMethod: info.FullMethod, IsClientStream: info.IsClientStream, IsServerStream: info.IsServerStream}
	mc := &methodChain{info: kept, final: final, next: c.link(kept, handler)}
	v, _ := c.chains.LoadOrStore(info.FullMethod, mc)
	if mc = v.(*methodChain); mc.final != final {
		return nil
	}
	return mc
}

// registered reports whether method is a stream method of a service registered on the
// server. Services are all registered before the server serves (gRPC refuses a registration
// after Serve), so the set is read once, at the first call.
func (c *streamChain) registered(method string) bool {
	c.once.Do(func() {
		c.methods = map[string]bool{}
		g := c.server.Load()
		if g == nil {
			return
		}
		for svc, si := range g.GetServiceInfo() {
			for _, m := range si.Methods {
				if m.IsClientStream || m.IsServerStream {
					c.methods["/"+svc+"/"+m.Name] = true
				}
			}
		}
	})
	return c.methods[method]
}

// link returns the handler ints[0] calls for a call of info ending in final: ints[1] with
// the handler after it, and so on, then final.
func (c *streamChain) link(info *grpc.StreamServerInfo, final grpc.StreamHandler) grpc.StreamHandler {
	next := final
	for i := len(c.ints) - 1; i >= 1; i-- {
		in, after := c.ints[i], next
		next = func(srv any, ss grpc.ServerStream) error { return in(srv, ss, info, after) }
	}
	return next
}
