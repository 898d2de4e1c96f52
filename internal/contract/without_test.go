package contract

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
)

// TestValidateWithout: the request's other fields are checked, the left-out field's rules
// (and those of what it holds) are not, the message's own rules still see the field (a
// request with a package does not break "exactly one package"), and the request is not
// changed.
func TestValidateWithout(t *testing.T) {
	v, err := NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	fd := (&handoffv1.DeliverRequest{}).ProtoReflect().Descriptor().Fields().ByName("package")
	fields := func(err error) []string {
		var out []string
		for _, r := range Reasons(err) {
			out = append(out, r.GetField()+" "+r.GetRule())
		}
		slices.Sort(out)
		return out
	}
	bad := &handoffv1.HandoffPackage{Schema: V1, JobId: "bad id!", Stage: "draft"}
	req := &handoffv1.DeliverRequest{Package: bad, Agent: "Bad Agent"}
	before := proto.Clone(req)
	all := fields(v.Validate(req))
	got := fields(v.ValidateWithout(req, fd))
	if !slices.Equal(got, []string{"agent string.pattern"}) {
		t.Fatalf("ValidateWithout = %v, want only the agent's reason (Validate: %v)", got, all)
	}
	if len(all) <= len(got) {
		t.Fatalf("Validate = %v: the package's reasons are missing, the test proves nothing", all)
	}
	if !proto.Equal(req, before) {
		t.Fatal("ValidateWithout changed the request")
	}
	if err := v.ValidateWithout(&handoffv1.DeliverRequest{Package: bad}, fd); err != nil {
		t.Fatalf("a request whose only fault is its left-out package: %v", err)
	}
	// The message rule over both package fields still runs: with neither, it is broken.
	if got := fields(v.ValidateWithout(&handoffv1.DeliverRequest{}, fd)); len(got) != 1 {
		t.Fatalf("no package at all: %v, want the one message-level reason", got)
	}
	// Only package is left out: package_v2's rules still run.
	v2 := &handoffv1.DeliverRequest{PackageV2: &handoffv2.HandoffPackage{Schema: V2}}
	if got := fields(v.ValidateWithout(v2, fd)); len(got) == 0 {
		t.Fatal("a broken package_v2 passed: only package was to be left out")
	}
}
