package hop_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
)

// panicOf returns what fn panics with ("" when it returns).
func panicOf(fn func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	fn()
	return ""
}

const deliver = handoffv1.AgentRunnerService_Deliver_FullMethodName

func TestSiteMethodName(t *testing.T) {
	svc, name := hop.Site{Pkg: "p", Opt: "O", FullMethod: deliver}.MethodName()
	if svc != "handoff.v1.AgentRunnerService" || name != "Deliver" {
		t.Errorf("MethodName = %q, %q", svc, name)
	}
	for _, bad := range []string{"", "/", "handoff.v1.AgentRunnerService/Deliver", "/handoff.v1.AgentRunnerService", "//Deliver", "/svc/", "/svc/a/b"} {
		want := fmt.Sprintf("budget: WithDebitMethods(%q): want a full method name \"/package.Service/Method\"", bad)
		if got := panicOf(func() { hop.Site{Pkg: "budget", Opt: "WithDebitMethods", FullMethod: bad}.MethodName() }); got != want {
			t.Errorf("MethodName(%q) panics %q; want %q", bad, got, want)
		}
	}
}

func TestSiteLookup(t *testing.T) {
	md := hop.Site{Pkg: "p", Opt: "O", FullMethod: deliver}.Lookup()
	if md == nil || md.Input().FullName() != "handoff.v1.DeliverRequest" || !md.IsStreamingServer() {
		t.Errorf("Lookup(Deliver) = %v", md)
	}
	for _, m := range []string{"/no.such.Service/Deliver", "/handoff.v1.AgentRunnerService/NoSuch", "/handoff.v1.HandoffPackage/Deliver"} {
		if md := (hop.Site{Pkg: "p", Opt: "O", FullMethod: m}).Lookup(); md != nil {
			t.Errorf("Lookup(%q) = %v; want nil", m, md)
		}
	}
	if got := panicOf(func() { hop.Site{Pkg: "p", Opt: "O", FullMethod: "bad"}.Lookup() }); got == "" {
		t.Error("Lookup(malformed) did not panic")
	}
}

func TestSiteFactory(t *testing.T) {
	s := hop.Site{Pkg: "idempotency", Opt: "WithKey", FullMethod: "/x.Y/Z"}
	in := (&handoffv1.DeliverRequest{}).ProtoReflect().Descriptor()
	newDeliver := func() proto.Message { return &handoffv1.DeliverRequest{} }
	newCheck := func() proto.Message { return &handoffv1.CheckRequest{} }

	if f := s.Factory("newResp", "message", newCheck, nil); f == nil || f().ProtoReflect().Descriptor().FullName() != "handoff.v1.CheckRequest" {
		t.Error("Factory(unregistered method, newMsg) does not return newMsg")
	}
	if f := s.Factory("newResp", "message", nil, in); f == nil {
		t.Error("Factory(nil, registered) = nil")
	} else if m, ok := f().(*handoffv1.DeliverRequest); !ok || m == nil {
		t.Errorf("Factory(nil, registered)() = %T; want *DeliverRequest", f())
	}
	if f := s.Factory("newResp", "message", newDeliver, in); f().ProtoReflect().Descriptor().FullName() != in.FullName() {
		t.Error("Factory(matching newMsg) does not return it")
	}
	many, _ := oddMessages(t) // no Go type registered
	for _, c := range []struct {
		name   string
		newMsg func() proto.Message
		md     protoreflect.MessageDescriptor
		want   string
	}{
		{"nothing", nil, nil, `idempotency: WithKey("/x.Y/Z"): newResp is nil and the method is not in the protobuf registry`},
		{"no Go type", nil, many, `idempotency: WithKey("/x.Y/Z"): newResp is nil and hoptest.Many has no registered Go type`},
		{"wrong type", newCheck, in, `idempotency: WithKey("/x.Y/Z"): newResp makes handoff.v1.CheckRequest, the method's message is handoff.v1.DeliverRequest`},
	} {
		if got := panicOf(func() { s.Factory("newResp", "message", c.newMsg, c.md) }); got != c.want {
			t.Errorf("%s: panics %q; want %q", c.name, got, c.want)
		}
	}
}

func TestMessageFactory(t *testing.T) {
	if f := hop.MessageFactory("validate", "WithStreamRequest", deliver, nil); f == nil {
		t.Fatal("MessageFactory(Deliver, nil) = nil")
	} else if _, ok := f().(*handoffv1.DeliverRequest); !ok {
		t.Errorf("MessageFactory(Deliver, nil)() = %T; want *DeliverRequest", f())
	}
	newCheck := func() proto.Message { return &handoffv1.CheckRequest{} }
	if f := hop.MessageFactory("validate", "WithStreamRequest", "/x.Y/Z", newCheck); f == nil {
		t.Error("MessageFactory(unregistered, newReq) = nil")
	}
	for _, c := range []struct {
		method string
		newReq func() proto.Message
		want   string
	}{
		{"Deliver", nil, `budget: WithStreamRequest("Deliver"): want a full method name "/package.Service/Method"`},
		{"/x.Y/Z", nil, `budget: WithStreamRequest("/x.Y/Z"): newReq is nil and the method is not in the protobuf registry`},
		{deliver, newCheck, `budget: WithStreamRequest("/handoff.v1.AgentRunnerService/Deliver"): newReq makes handoff.v1.CheckRequest, the method's input is handoff.v1.DeliverRequest`},
	} {
		if got := panicOf(func() { hop.MessageFactory("budget", "WithStreamRequest", c.method, c.newReq) }); got != c.want {
			t.Errorf("MessageFactory(%q) panics %q; want %q", c.method, got, c.want)
		}
	}
}
