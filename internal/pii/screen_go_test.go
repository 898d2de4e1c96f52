package pii

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

// TestScreenGoSeesWhatProtoreflectSees: for every free-text field the walk reaches (to
// depth 4) in the messages receivers scan, personal data in that one field is found the
// same in the generated message (read through its Go struct) as in its dynamicpb twin (read
// through protoreflect). A field added to the proto that the Go path did not read would
// make the two disagree.
func TestScreenGoSeesWhatProtoreflectSees(t *testing.T) {
	d := Builtin()
	const text = "write to jane@example.com"
	roots := []proto.Message{&handoffv1.HandoffPackage{}, &handoffv2.HandoffPackage{}, &handoffv1.DeliverRequest{},
		&handoffv1.StageResult{}, &handoffv1.SubmitJobRequest{}, &handoffv1.ResolveEscalationRequest{}, &handoffv1.CheckRequest{}}
	checked := 0
	for _, root := range roots {
		var walk func(path []protoreflect.FieldDescriptor, md protoreflect.MessageDescriptor, depth int)
		walk = func(path []protoreflect.FieldDescriptor, md protoreflect.MessageDescriptor, depth int) {
			fields := md.Fields()
			for i := 0; i < fields.Len(); i++ {
				fd := fields.Get(i)
				switch {
				case fd.Kind() == protoreflect.StringKind && !fd.IsMap() && slices.Contains(freeText, fd.Name()):
					full := append(slices.Clone(path), fd)
					m := root.ProtoReflect().New()
					set(m, full, text)
					dyn := dynamicpb.NewMessage(md0(root))
					b, err := proto.Marshal(m.Interface())
					if err != nil {
						t.Fatal(err)
					}
					if err := proto.Unmarshal(b, dyn); err != nil {
						t.Fatal(err)
					}
					gen, ref := d.Scan(m.Interface()), d.Scan(dyn)
					if len(ref) != 1 || !slices.Equal(gen, ref) {
						t.Errorf("%s %s: generated %v, protoreflect %v", root.ProtoReflect().Descriptor().FullName(), name(full), gen, ref)
					}
					checked++
				case fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && fd.Message().FullName().Parent() != "google.protobuf" && depth > 0:
					walk(append(slices.Clone(path), fd), fd.Message(), depth-1)
				}
			}
		}
		walk(nil, root.ProtoReflect().Descriptor(), 4)
	}
	if checked < 20 {
		t.Fatalf("only %d free-text fields checked", checked)
	}
}

func md0(m proto.Message) protoreflect.MessageDescriptor { return m.ProtoReflect().Descriptor() }

// set sets the string at path in m to s, making each message on the way (one element of a
// list).
func set(m protoreflect.Message, path []protoreflect.FieldDescriptor, s string) {
	fd := path[0]
	if len(path) == 1 {
		if fd.IsList() {
			m.Mutable(fd).List().Append(protoreflect.ValueOfString(s))
		} else {
			m.Set(fd, protoreflect.ValueOfString(s))
		}
		return
	}
	if fd.IsList() {
		l := m.Mutable(fd).List()
		e := l.NewElement()
		set(e.Message(), path[1:], s)
		l.Append(e)
		return
	}
	set(m.Mutable(fd).Message(), path[1:], s)
}

func name(path []protoreflect.FieldDescriptor) string {
	var out string
	for i, fd := range path {
		if i > 0 {
			out += "."
		}
		out += string(fd.Name())
	}
	return out
}
