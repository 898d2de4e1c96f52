package hop_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/testkit"
)

const tp = testkit.Traceparent

func pkg() *handoffv1.HandoffPackage { return testkit.Package() }

// oddMessages builds messages that have fields named "package" and "ack" that are not a
// singular HandoffPackage / Ack: Many (repeated), Other (other types).
func oddMessages(t *testing.T) (many, other protoreflect.MessageDescriptor) {
	t.Helper()
	field := func(name string, n int32, label descriptorpb.FieldDescriptorProto_Label, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), JsonName: proto.String(name), Number: proto.Int32(n), Label: label.Enum(), Type: typ.Enum()}
		if typeName != "" {
			f.TypeName = proto.String(typeName)
		}
		return f
	}
	const (
		rep = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
		opt = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
		msg = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		str = descriptorpb.FieldDescriptorProto_TYPE_STRING
	)
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("hop_test.proto"),
		Package:    proto.String("hoptest"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{handoffv1.File_handoff_v1_handoff_proto.Path()},
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Many"), Field: []*descriptorpb.FieldDescriptorProto{
				field("package", 1, rep, msg, ".handoff.v1.HandoffPackage"),
				field("ack", 2, rep, msg, ".handoff.v1.Ack"),
			}},
			{Name: proto.String("Other"), Field: []*descriptorpb.FieldDescriptorProto{
				field("package", 1, opt, msg, ".handoff.v1.Ack"),
				field("ack", 2, opt, str, ""),
			}},
		},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName("Many"), fd.Messages().ByName("Other")
}

func TestPackageAndAckField(t *testing.T) {
	many, other := oddMessages(t)
	for _, c := range []struct {
		name     string
		md       protoreflect.MessageDescriptor
		pkg, ack bool
	}{
		{"DeliverRequest", (&handoffv1.DeliverRequest{}).ProtoReflect().Descriptor(), true, false},
		{"CheckRequest", (&handoffv1.CheckRequest{}).ProtoReflect().Descriptor(), true, false},
		{"WriteRequest", (&handoffv1.WriteRequest{}).ProtoReflect().Descriptor(), true, false},
		{"DeliverResponse (oneof ack)", (&handoffv1.DeliverResponse{}).ProtoReflect().Descriptor(), false, true},
		{"CheckResponse", (&handoffv1.CheckResponse{}).ProtoReflect().Descriptor(), false, true},
		{"HandoffPackage", (&handoffv1.HandoffPackage{}).ProtoReflect().Descriptor(), false, false},
		{"repeated fields", many, false, false},
		{"other types", other, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if fd := hop.PackageField(c.md); (fd != nil) != c.pkg || (fd != nil && fd.Name() != "package") {
				t.Errorf("PackageField = %v; want found=%v", fd, c.pkg)
			}
			if fd := hop.AckField(c.md); (fd != nil) != c.ack || (fd != nil && fd.Name() != "ack") {
				t.Errorf("AckField = %v; want found=%v", fd, c.ack)
			}
		})
	}
}

func TestFindPackage(t *testing.T) {
	p := pkg()
	if got := hop.FindPackage(p); got != p {
		t.Errorf("FindPackage(package) = %p; want the package itself %p", got, p)
	}
	req := &handoffv1.DeliverRequest{Package: p}
	if got := hop.FindPackage(req); got != p {
		t.Errorf("FindPackage(DeliverRequest) = %p; want its own package %p (not a copy)", got, p)
	}
	// A dynamic request carries a dynamic package: not the generated type, so none.
	dyn := dynamicpb.NewMessage(req.ProtoReflect().Descriptor())
	b, _ := proto.Marshal(req)
	if err := proto.Unmarshal(b, dyn); err != nil {
		t.Fatal(err)
	}
	many, _ := oddMessages(t)
	for name, m := range map[string]any{
		"no package":   &handoffv1.DeliverRequest{},
		"no field":     &handoffv1.GetJobRequest{RunId: "r"},
		"not protobuf": "package",
		"nil":          nil,
		"dynamic":      dyn,
		"repeated":     dynamicpb.NewMessage(many),
	} {
		if got := hop.FindPackage(m); got != nil {
			t.Errorf("FindPackage(%s) = %v; want nil", name, got)
		}
	}
}

func TestFindAck(t *testing.T) {
	a := &handoffv1.Ack{JobId: "job-1", Status: handoffv1.AckStatus_ACK_STATUS_ACCEPTED}
	if got := hop.FindAck(a); got != a {
		t.Errorf("FindAck(ack) = %p; want the ack itself %p", got, a)
	}
	if got := hop.FindAck(&handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Ack{Ack: a}}); got != a {
		t.Errorf("FindAck(DeliverResponse{ack}) = %p; want its ack %p", got, a)
	}
	if got := hop.FindAck(&handoffv1.CheckResponse{Ack: a}); got != a {
		t.Errorf("FindAck(CheckResponse) = %p; want its ack %p", got, a)
	}
	for name, m := range map[string]any{
		"other oneof member": &handoffv1.DeliverResponse{Event: &handoffv1.DeliverResponse_Result{Result: &handoffv1.StageResult{}}},
		"no ack":             &handoffv1.CheckResponse{},
		"no field":           &handoffv1.GetJobRequest{},
		"not protobuf":       42,
		"nil":                nil,
	} {
		if got := hop.FindAck(m); got != nil {
			t.Errorf("FindAck(%s) = %v; want nil", name, got)
		}
	}
}

func TestAsPackage(t *testing.T) {
	p := pkg()
	got, err := hop.AsPackage(p.ProtoReflect())
	if err != nil || got != p {
		t.Errorf("AsPackage(generated) = %p, %v; want the package itself %p", got, err, p)
	}
	dyn := dynamicpb.NewMessage(p.ProtoReflect().Descriptor())
	b, _ := proto.Marshal(p)
	if err := proto.Unmarshal(b, dyn); err != nil {
		t.Fatal(err)
	}
	got, err = hop.AsPackage(dyn)
	if err != nil || !proto.Equal(got, p) {
		t.Errorf("AsPackage(dynamic) = %v, %v; want a copy equal to %v", got, err, p)
	}
}

func TestUnder(t *testing.T) {
	for _, c := range []struct{ field, want string }{
		{"job_id", "package.job_id"},
		{"artifacts[0].uri", "package.artifacts[0].uri"},
		{"", "package"},
	} {
		r := &handoffv1.Reason{Field: c.field, Rule: "required", Message: "m"}
		got := hop.Under("package", r)
		want := &handoffv1.Reason{Field: c.want, Rule: "required", Message: "m"}
		testkit.Equal(t, got, want, fmt.Sprintf("Under(package, %q)", c.field))
		if r.GetField() != c.field {
			t.Errorf("Under modified its argument: field %q", r.GetField())
		}
	}
}
