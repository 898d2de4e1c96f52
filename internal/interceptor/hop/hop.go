// Package hop holds what the hop interceptors (validate, budget, idempotency, trace) and the
// Ack metrics share: finding the handoff package or the Ack a message carries by reflection,
// naming reasons relative to a request, building message factories for configured methods,
// answering a rejection with an Ack, and replaying a request an interceptor already received.
package hop

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

var (
	packageName   = (&handoffv1.HandoffPackage{}).ProtoReflect().Descriptor().FullName()
	packageV2Name = (&handoffv2.HandoffPackage{}).ProtoReflect().Descriptor().FullName()
	ackName       = (&handoffv1.Ack{}).ProtoReflect().Descriptor().FullName()
)

// PackageField returns md's "package" field when it is a singular handoff.v1.HandoffPackage;
// otherwise nil.
func PackageField(md protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	return messageField(md, "package", packageName)
}

// PackageV2Field returns md's "package_v2" field when it is a singular
// handoff.v2.HandoffPackage; otherwise nil.
func PackageV2Field(md protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	return messageField(md, "package_v2", packageV2Name)
}

// FindPackageV2 is FindPackage for the handoff.v2 package a request carries (package_v2).
func FindPackageV2(m any) *handoffv2.HandoffPackage {
	return find[*handoffv2.HandoffPackage](m, PackageV2Field)
}

// AckField returns md's "ack" field when it is a singular handoff.v1.Ack; otherwise nil.
func AckField(md protoreflect.MessageDescriptor) protoreflect.FieldDescriptor {
	return messageField(md, "ack", ackName)
}

func messageField(md protoreflect.MessageDescriptor, name protoreflect.Name, typ protoreflect.FullName) protoreflect.FieldDescriptor {
	fd := md.Fields().ByName(name)
	if fd == nil || fd.Kind() != protoreflect.MessageKind || fd.IsList() || fd.IsMap() || fd.Message().FullName() != typ {
		return nil
	}
	return fd
}

// FindPackage returns the HandoffPackage m carries: m itself, or its set "package" field
// (PackageField). It is the message in m, not a copy; nil when there is none or it is not the
// generated Go type (a dynamicpb message).
func FindPackage(m any) *handoffv1.HandoffPackage {
	return find[*handoffv1.HandoffPackage](m, PackageField)
}

// FindAck returns the Ack m carries: m itself, or its set "ack" field (AckField; a oneof
// member too, as in DeliverResponse). It is the message in m, not a copy; nil when there is
// none or it is not the generated Go type.
func FindAck(m any) *handoffv1.Ack {
	return find[*handoffv1.Ack](m, AckField)
}

// find returns m when it is a T, else the T in m's field that field finds, when set.
func find[T proto.Message](m any, field func(protoreflect.MessageDescriptor) protoreflect.FieldDescriptor) T {
	var none T
	pm, ok := m.(proto.Message)
	if !ok {
		return none
	}
	if x, ok := pm.(T); ok {
		return x
	}
	r := pm.ProtoReflect()
	fd := field(r.Descriptor())
	if fd == nil || !r.Has(fd) {
		return none
	}
	x, _ := r.Get(fd).Message().Interface().(T)
	return x
}

// AsPackage returns m as the generated type (copying it when it is, e.g., a dynamicpb
// message).
func AsPackage(m protoreflect.Message) (*handoffv1.HandoffPackage, error) {
	if p, ok := m.Interface().(*handoffv1.HandoffPackage); ok {
		return p, nil
	}
	b, err := proto.Marshal(m.Interface())
	if err != nil {
		return nil, err
	}
	p := &handoffv1.HandoffPackage{}
	return p, proto.Unmarshal(b, p)
}

// Under returns a copy of r with its field moved under the request field name: "job_id"
// becomes "package.job_id", "" becomes "package".
func Under(name string, r *handoffv1.Reason) *handoffv1.Reason {
	field := name
	if r.GetField() != "" {
		field += "." + r.GetField()
	}
	return &handoffv1.Reason{Field: field, Rule: r.GetRule(), Message: r.GetMessage()}
}
