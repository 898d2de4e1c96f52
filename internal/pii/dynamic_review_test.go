package pii

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// TestScreenDynamicAfterAnotherDynamic: every dynamicpb message has the one Go type
// *dynamicpb.Message, whatever its descriptor. The screen's Go-struct plans are cached by Go
// type, so the plan made for the first dynamicpb message screened (one with nothing to
// read: an empty plan) must not stand for every later dynamicpb message, or personal data in
// a dynamicpb package's goal is reported clean.
func TestScreenDynamicAfterAnotherDynamic(t *testing.T) {
	goPlans.Clear() // the order of screens is the point: start from an empty cache
	t.Cleanup(goPlans.Clear)
	d := Builtin()

	// A message with no free text and no message field to descend into.
	empty := dynamicpb.NewMessage((&handoffv1.DescribeRequest{}).ProtoReflect().Descriptor())
	if fs := d.Scan(empty); fs != nil {
		t.Fatalf("an empty message: %v", fs)
	}

	b, err := proto.Marshal(&handoffv1.HandoffPackage{Goal: "write to jane@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	pkg := dynamicpb.NewMessage((&handoffv1.HandoffPackage{}).ProtoReflect().Descriptor())
	if err := proto.Unmarshal(b, pkg); err != nil {
		t.Fatal(err)
	}
	fs := d.Scan(pkg)
	if len(fs) != 1 || fs[0].Field != "goal" || fs[0].Kind != "email" {
		t.Fatalf("a dynamicpb package with an e-mail in goal, screened after an empty dynamicpb message: %v, want goal (email)", fs)
	}

	// And the generated types keep their own plans.
	if fs := d.Scan(&handoffv1.HandoffPackage{Goal: "call +1 415 555 0100"}); len(fs) != 1 || fs[0].Field != "goal" {
		t.Fatalf("generated package after the dynamicpb ones: %v", fs)
	}
}
