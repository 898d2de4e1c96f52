package hop

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Site is an option call that configures a method, as its panics name it:
// "<Pkg>: <Opt>(<FullMethod>): ...".
type Site struct {
	Pkg        string // the interceptor package: "budget"
	Opt        string // the option: "WithStreamRequest"
	FullMethod string // the method it configures: "/handoff.v1.AgentRunnerService/Deliver"
}

// Panicf panics with format and args after the site's prefix.
func (s Site) Panicf(format string, args ...any) {
	panic(fmt.Sprintf("%s: %s(%q): "+format, append([]any{s.Pkg, s.Opt, s.FullMethod}, args...)...))
}

// MethodName splits FullMethod ("/package.Service/Method") into the service's full name and
// the method's name. It panics when FullMethod is not of that form.
func (s Site) MethodName() (svc, name string) {
	svc, name, ok := strings.Cut(strings.TrimPrefix(s.FullMethod, "/"), "/")
	if !ok || !strings.HasPrefix(s.FullMethod, "/") || svc == "" || name == "" || strings.Contains(name, "/") {
		s.Panicf("want a full method name \"/package.Service/Method\"")
	}
	return svc, name
}

// Lookup finds FullMethod in the global protobuf registry; nil when it is not registered
// there. It panics on a malformed name (MethodName).
func (s Site) Lookup() protoreflect.MethodDescriptor {
	svc, name := s.MethodName()
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(name))
}

// Factory returns newMsg, or when it is nil a factory for md's registered Go type; md is the
// method's message (its input or output), nil when the method is not registered. It panics
// when neither is available or newMsg makes another type than md. arg names newMsg in the
// panics ("newReq"), role names md ("input": "the method's input is ...").
func (s Site) Factory(arg, role string, newMsg func() proto.Message, md protoreflect.MessageDescriptor) func() proto.Message {
	if md == nil {
		if newMsg == nil {
			s.Panicf("%s is nil and the method is not in the protobuf registry", arg)
		}
		return newMsg
	}
	if newMsg == nil {
		mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
		if err != nil {
			s.Panicf("%s is nil and %s has no registered Go type", arg, md.FullName())
		}
		return func() proto.Message { return mt.New().Interface() }
	}
	if got := newMsg().ProtoReflect().Descriptor().FullName(); got != md.FullName() {
		s.Panicf("%s makes %s, the method's %s is %s", arg, got, role, md.FullName())
	}
	return newMsg
}

// MessageFactory returns newReq, or when it is nil a factory for the registered input type of
// fullMethod, for the option opt of the interceptor package pkg (WithStreamRequest). It
// panics on a malformed method name, when neither is available, or when newReq makes another
// type than the method's input.
func MessageFactory(pkg, opt, fullMethod string, newReq func() proto.Message) func() proto.Message {
	s := Site{Pkg: pkg, Opt: opt, FullMethod: fullMethod}
	var in protoreflect.MessageDescriptor
	if md := s.Lookup(); md != nil {
		in = md.Input()
	}
	return s.Factory("newReq", "input", newReq, in)
}
