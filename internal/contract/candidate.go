package contract

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"buf.build/go/protovalidate"
	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// A candidate rule is a protovalidate annotation the contract does not have yet, written in
// a proto file: a message with the field numbers of the package it would constrain (a copy
// of handoff.v1's HandoffPackage, or only the fields the rule is about) and the stricter
// rule on the field. Checking stored packages against it answers "does the data already
// comply?" before the rule is tightened: each package is read into the candidate message
// by its wire form (same numbers, same values; fields the candidate omits are carried along
// unread) and validated.

// Candidate is a compiled candidate rule set.
type Candidate struct {
	md protoreflect.MessageDescriptor
	pv protovalidate.Validator
}

// Finding is one stored value the candidate rejects.
type Finding struct {
	Field   string // path in the package, proto names ("artifacts[2].type")
	Rule    string // the rule id ("string.in")
	Message string
	Value   string // the value rejected, as text ("" when there is none, e.g. required)
}

// LoadCandidate compiles the proto file at path (its imports from its own folder, else the
// ones this build has compiled in: buf/validate/validate.proto, handoff/v1/*.proto, the
// well-known types) and picks message: a full name, or "" for the file's only message named
// HandoffPackage. Errors name the file and the message.
func LoadCandidate(ctx context.Context, path, message string) (*Candidate, error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("candidate %s: %w", path, err)
	}
	src := &protocompile.SourceResolver{ImportPaths: []string{dir}}
	comp := protocompile.Compiler{
		Resolver: protocompile.ResolverFunc(func(p string) (protocompile.SearchResult, error) {
			if p != name {
				if fd, err := protoregistry.GlobalFiles.FindFileByPath(p); err == nil {
					return protocompile.SearchResult{Desc: fd}, nil
				}
			}
			return src.FindFileByPath(p)
		}),
	}
	files, err := comp.Compile(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("candidate %s: %w", path, err)
	}
	fd := files[0]
	want := message
	if want == "" {
		want = "HandoffPackage"
	}
	var md protoreflect.MessageDescriptor
	for i := range fd.Messages().Len() {
		if m := fd.Messages().Get(i); string(m.FullName()) == want || string(m.Name()) == want {
			md = m
		}
	}
	if md == nil {
		return nil, fmt.Errorf("candidate %s: no top-level message %q in package %s (name another with --message)", path, want, fd.Package())
	}
	pv, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("candidate %s: %w", path, err)
	}
	c := &Candidate{md: md, pv: pv}
	// A rule that cannot compile (a CEL typo) fails here, not on the first package.
	if err := c.pv.Validate(dynamicpb.NewMessage(md)); err != nil {
		var ve *protovalidate.ValidationError
		if !errors.As(err, &ve) {
			return nil, fmt.Errorf("candidate %s: message %s: %w", path, md.FullName(), err)
		}
	}
	return c, nil
}

// Message is the full name of the candidate's message.
func (c *Candidate) Message() string { return string(c.md.FullName()) }

// Check returns what the candidate rejects in m (a stored package), in field order; nil
// when m complies. An error means the check could not run (m does not fit the candidate's
// wire form, or a rule failed to evaluate): that is no verdict on the data.
func (c *Candidate) Check(m proto.Message) ([]Finding, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	dm := dynamicpb.NewMessage(c.md)
	if err := proto.Unmarshal(b, dm); err != nil {
		return nil, fmt.Errorf("the package does not fit %s: %w", c.md.FullName(), err)
	}
	err = c.pv.Validate(dm)
	if err == nil {
		return nil, nil
	}
	var ve *protovalidate.ValidationError
	if !errors.As(err, &ve) {
		return nil, err
	}
	var out []Finding
	for _, v := range ve.Violations {
		f := Finding{Field: protovalidate.FieldPathString(v.Proto.GetField()), Rule: v.Proto.GetRuleId(), Message: v.Proto.GetMessage()}
		if v.FieldValue.IsValid() {
			f.Value = clip(fmt.Sprint(v.FieldValue.Interface()), 200)
			if v.FieldDescriptor != nil && v.FieldDescriptor.Kind() == protoreflect.EnumKind {
				if ev := v.FieldDescriptor.Enum().Values().ByNumber(v.FieldValue.Enum()); ev != nil {
					f.Value = string(ev.Name())
				}
			}
		}
		out = append(out, f)
	}
	return out, nil
}
