package pii

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
)

// freeText names the fields that hold text a stage, a tool or a person wrote, or a caller
// passed through: a package's prose, a judge's failure details and a tool attempt's
// (detail), a stage's error, an operator's comment or reason (ResolveEscalationRequest), a
// route's reason, the submitted tracestate, and memory refs (whose id part is free). Every
// other field is an id, a URI, a number or an enum, checked by the contract's own rules.
var freeText = []protoreflect.Name{"goal", "constraints", "open_questions", "next_hint", "resolved_questions", "comment", "reason",
	"detail", "error", "tracestate", "memory_refs"}

// Finding is one field holding personal data: its path ("goal", "open_questions[1]") and
// the kind of the first piece found. It never holds the value.
type Finding struct {
	Field string
	Kind  string
}

// Scan returns the free-text fields of m (a handoff.v1 or v2 package, a SubmitJobRequest, a
// StageResult: any message with fields of those names) that hold personal data, in field
// order. A nil message has none.
func (d *Detector) Scan(m proto.Message) []Finding {
	if m == nil {
		return nil
	}
	if !d.screen(m.ProtoReflect(), 4) {
		return nil // every receiver scans every hop: the clean case builds no path and no setter
	}
	var out []Finding
	each(m.ProtoReflect(), func(path string, s string, _ func(string)) {
		if k, ok := d.First(s); ok {
			out = append(out, Finding{Field: path, Kind: k})
		}
	})
	return out
}

// plan is what a walk reads of one message type: its free-text string fields, in freeText's
// order, and the message fields it descends into, in field order. It is looked up once per
// type (plans) instead of by name, eleven lookups a message, on every scan.
type plan struct {
	texts []protoreflect.FieldDescriptor
	msgs  []protoreflect.FieldDescriptor
}

var plans sync.Map // protoreflect.MessageDescriptor → *plan

func planOf(md protoreflect.MessageDescriptor) *plan {
	if p, ok := plans.Load(md); ok {
		return p.(*plan)
	}
	p := &plan{}
	fields := md.Fields()
	for _, name := range freeText {
		if fd := fields.ByName(name); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsMap() {
			p.texts = append(p.texts, fd)
		}
	}
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && fd.Message().FullName().Parent() != "google.protobuf" {
			p.msgs = append(p.msgs, fd)
		}
	}
	plans.Store(md, p)
	return p
}

// screen reports whether any free-text string of r, or of the messages r holds to depth,
// holds personal data: the same fields each visits, without their paths or setters, so a
// clean message (every hop's case) costs no allocation. A generated message is read through
// its Go struct (goPlan): protoreflect would allocate a value for every string of a
// repeated field and a view of every list it reads.
func (d *Detector) screen(r protoreflect.Message, depth int) bool {
	if v := reflect.ValueOf(r.Interface()); v.Kind() == reflect.Pointer && !v.IsNil() {
		if gp := goPlanOf(v.Type(), r.Descriptor()); gp != nil {
			return d.screenGo(v.Elem(), gp, depth)
		}
	}
	p := planOf(r.Descriptor())
	for _, fd := range p.texts {
		if !r.Has(fd) {
			continue
		}
		if !fd.IsList() {
			if d.Find(r.Get(fd).String()) != nil {
				return true
			}
			continue
		}
		l := r.Get(fd).List()
		for i := 0; i < l.Len(); i++ {
			if d.Find(l.Get(i).String()) != nil {
				return true
			}
		}
	}
	if depth == 0 {
		return false
	}
	for _, fd := range p.msgs {
		if !r.Has(fd) {
			continue
		}
		if !fd.IsList() {
			if d.screen(r.Get(fd).Message(), depth-1) {
				return true
			}
			continue
		}
		l := r.Get(fd).List()
		for j := 0; j < l.Len(); j++ {
			if d.screen(l.Get(j).Message(), depth-1) {
				return true
			}
		}
	}
	return false
}

// goPlan is plan for a generated message's Go struct: the struct field of each of plan's
// fields, read with Go reflection.
type goPlan struct {
	md    protoreflect.MessageDescriptor // the message type the plan reads
	texts []goField
	msgs  []goField
}

type goField struct {
	index int
	kind  goKind
	md    protoreflect.MessageDescriptor // a message field's message
}

type goKind int

const (
	goString      goKind = iota // string
	goOptString                 // *string (proto3 optional)
	goStrings                   // []string
	goMessage                   // *T
	goMessageList               // []*T
)

var goPlans sync.Map // reflect.Type (a pointer to a generated struct) → *goPlan, or nil

// goPlanOf returns the goPlan of t, the Go type of messages of md; nil when t is not a
// generated struct whose every plan field is a plain struct field (a dynamicpb message, a
// oneof member): those are read with protoreflect. One Go type can stand for many message
// types (*dynamicpb.Message is every dynamic message's), so a plan is used only for the
// message type it was made for: another one is read with protoreflect.
func goPlanOf(t reflect.Type, md protoreflect.MessageDescriptor) *goPlan {
	v, ok := goPlans.Load(t)
	if !ok {
		v, _ = goPlans.LoadOrStore(t, buildGoPlan(t, md))
	}
	if gp := v.(*goPlan); gp != nil && gp.md == md {
		return gp
	}
	return nil
}

func buildGoPlan(t reflect.Type, md protoreflect.MessageDescriptor) *goPlan {
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil
	}
	st := t.Elem()
	byName := map[string]int{}
	for i := 0; i < st.NumField(); i++ {
		for _, part := range strings.Split(st.Field(i).Tag.Get("protobuf"), ",") {
			if name, ok := strings.CutPrefix(part, "name="); ok {
				byName[name] = i
			}
		}
	}
	p := planOf(md)
	gp := &goPlan{md: md}
	field := func(fd protoreflect.FieldDescriptor) (goField, bool) {
		i, ok := byName[string(fd.Name())]
		if !ok || fd.ContainingOneof() != nil && !fd.HasOptionalKeyword() {
			return goField{}, false
		}
		ft := st.Field(i).Type
		f := goField{index: i}
		switch {
		case fd.Kind() == protoreflect.StringKind && fd.IsList() && ft == reflect.TypeFor[[]string]():
			f.kind = goStrings
		case fd.Kind() == protoreflect.StringKind && !fd.IsList() && ft.Kind() == reflect.String:
			f.kind = goString
		case fd.Kind() == protoreflect.StringKind && !fd.IsList() && ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.String:
			f.kind = goOptString
		case fd.Kind() == protoreflect.MessageKind && fd.IsList() && ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Pointer:
			f.kind, f.md = goMessageList, fd.Message()
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && ft.Kind() == reflect.Pointer:
			f.kind, f.md = goMessage, fd.Message()
		default:
			return goField{}, false
		}
		return f, true
	}
	for _, fd := range p.texts {
		f, ok := field(fd)
		if !ok {
			return nil
		}
		gp.texts = append(gp.texts, f)
	}
	for _, fd := range p.msgs {
		f, ok := field(fd)
		if !ok {
			return nil
		}
		gp.msgs = append(gp.msgs, f)
	}
	return gp
}

// screenGo is screen for the struct v of a generated message.
func (d *Detector) screenGo(v reflect.Value, gp *goPlan, depth int) bool {
	for _, f := range gp.texts {
		fv := v.Field(f.index)
		switch f.kind {
		case goString:
			if s := fv.String(); s != "" && d.Find(s) != nil {
				return true
			}
		case goOptString:
			if !fv.IsNil() && d.Find(fv.Elem().String()) != nil {
				return true
			}
		case goStrings:
			for i := 0; i < fv.Len(); i++ {
				if d.Find(fv.Index(i).String()) != nil {
					return true
				}
			}
		}
	}
	if depth == 0 {
		return false
	}
	for _, f := range gp.msgs {
		fv := v.Field(f.index)
		switch f.kind {
		case goMessage:
			if !fv.IsNil() && d.screenValue(fv, f.md, depth-1) {
				return true
			}
		case goMessageList:
			for j := 0; j < fv.Len(); j++ {
				if e := fv.Index(j); !e.IsNil() && d.screenValue(e, f.md, depth-1) {
					return true
				}
			}
		}
	}
	return false
}

// screenValue screens the message the non-nil pointer v holds.
func (d *Detector) screenValue(v reflect.Value, md protoreflect.MessageDescriptor, depth int) bool {
	if gp := goPlanOf(v.Type(), md); gp != nil {
		return d.screenGo(v.Elem(), gp, depth)
	}
	m, ok := v.Interface().(proto.Message)
	if !ok {
		return true // unreadable here: the full walk (each) decides
	}
	return d.screen(m.ProtoReflect(), depth)
}

// each calls fn for every set free-text string of r with its path and a setter, and of the
// messages r holds ("fail.reason", "route.reason", "tools_tried[2].detail"), to a depth of 4.
func each(r protoreflect.Message, fn func(path, s string, set func(string))) {
	eachAt(r, "", 4, fn)
}

func eachAt(r protoreflect.Message, prefix string, depth int, fn func(path, s string, set func(string))) {
	p := planOf(r.Descriptor())
	for _, fd := range p.texts {
		name := fd.Name()
		if !fd.IsList() {
			if s := r.Get(fd).String(); s != "" {
				fn(prefix+string(name), s, func(v string) { r.Set(fd, protoreflect.ValueOfString(v)) })
			}
			continue
		}
		l := r.Get(fd).List()
		for i := 0; i < l.Len(); i++ {
			i := i
			fn(fmt.Sprintf("%s%s[%d]", prefix, name, i), l.Get(i).String(), func(v string) { l.Set(i, protoreflect.ValueOfString(v)) })
		}
	}
	if depth == 0 {
		return
	}
	for _, fd := range p.msgs {
		if !r.Has(fd) {
			continue
		}
		if fd.IsList() {
			// tools_tried[i].detail, evaluator.failures[i].detail: repeated messages carry
			// prose too.
			l := r.Get(fd).List()
			for j := 0; j < l.Len(); j++ {
				eachAt(l.Get(j).Message(), fmt.Sprintf("%s%s[%d].", prefix, fd.Name(), j), depth-1, fn)
			}
			continue
		}
		eachAt(r.Get(fd).Message(), prefix+string(fd.Name())+".", depth-1, fn)
	}
}

// Reasons turns findings into contract reasons: field = the path under prefix ("" for a
// package's own paths, "package" for a request's), rule "pii", and a message naming the kind
// and what to do, never the value. No findings, nil.
func Reasons(prefix string, fs []Finding) []*handoffv1.Reason {
	if len(fs) == 0 {
		return nil
	}
	out := make([]*handoffv1.Reason, 0, len(fs))
	for _, f := range fs {
		field := f.Field
		if prefix != "" {
			field = prefix + "." + field
		}
		out = append(out, &handoffv1.Reason{
			Field: field, Rule: Rule,
			Message: fmt.Sprintf("%s holds %s: personal data does not travel in packages; keep it in the system of record and pass a memory ref", f.Field, Describe(f.Kind)),
		})
	}
	return out
}

// Keeper stores a found value apart and answers the memory ref ("pii:<id>") that replaces
// it. The same value of the same job must get the same ref, so that a job submitted twice
// is the same job.
type Keeper interface {
	Keep(ctx context.Context, jobID, kind, value string) (ref string, err error)
}

// Redact replaces, in place, every piece of personal data in m's free-text fields by the
// ref k keeps it under, and returns the findings it replaced (empty: m is unchanged). On an
// error m may be partly redacted and must not be used; the error never holds a value.
func (d *Detector) Redact(ctx context.Context, m proto.Message, jobID string, k Keeper) ([]Finding, error) {
	if m == nil {
		return nil, nil
	}
	if !d.screen(m.ProtoReflect(), 4) {
		return nil, nil
	}
	var out []Finding
	var failed error
	each(m.ProtoReflect(), func(path, s string, set func(string)) {
		if failed != nil {
			return
		}
		ms := d.Find(s)
		if len(ms) == 0 {
			return
		}
		var b strings.Builder
		prev := 0
		for _, mt := range ms {
			ref, err := k.Keep(ctx, jobID, mt.Kind, s[mt.Start:mt.End])
			if err != nil {
				failed = fmt.Errorf("pii: keeping %s of %s: %w", Describe(mt.Kind), path, err)
				return
			}
			b.WriteString(s[prev:mt.Start])
			b.WriteString(ref)
			prev = mt.End
		}
		b.WriteString(s[prev:])
		set(b.String())
		out = append(out, Finding{Field: path, Kind: ms[0].Kind})
	})
	return out, failed
}
