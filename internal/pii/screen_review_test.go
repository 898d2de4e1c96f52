package pii

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/testkit"
)

// refWalk is the full walk as it was before the screen and the field plans (3b13197~1):
// the free-text fields looked up by name, the message fields in field order, to depth 4.
// It is the reference the screen and today's walk must agree with.
func refWalk(d *Detector, m proto.Message) []Finding {
	var out []Finding
	var at func(r protoreflect.Message, prefix string, depth int)
	at = func(r protoreflect.Message, prefix string, depth int) {
		fields := r.Descriptor().Fields()
		for _, name := range freeText {
			fd := fields.ByName(name)
			if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsMap() {
				continue
			}
			if !fd.IsList() {
				if s := r.Get(fd).String(); s != "" {
					if k, ok := d.First(s); ok {
						out = append(out, Finding{Field: prefix + string(name), Kind: k})
					}
				}
				continue
			}
			l := r.Get(fd).List()
			for i := 0; i < l.Len(); i++ {
				if k, ok := d.First(l.Get(i).String()); ok {
					out = append(out, Finding{Field: fmt.Sprintf("%s%s[%d]", prefix, name, i), Kind: k})
				}
			}
		}
		if depth == 0 {
			return
		}
		for i := 0; i < fields.Len(); i++ {
			fd := fields.Get(i)
			if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || !r.Has(fd) || fd.Message().FullName().Parent() == "google.protobuf" {
				continue
			}
			if fd.IsList() {
				l := r.Get(fd).List()
				for j := 0; j < l.Len(); j++ {
					at(l.Get(j).Message(), fmt.Sprintf("%s%s[%d].", prefix, fd.Name(), j), depth-1)
				}
				continue
			}
			at(r.Get(fd).Message(), prefix+string(fd.Name())+".", depth-1)
		}
	}
	at(m.ProtoReflect(), "", 4)
	return out
}

var (
	// Each holds personal data on its own.
	dirtyTexts = []string{
		"reply to jane.doe+billing@example.co.uk today",
		"call +1 415 555 0100 after five",
		"card 4111 1111 1111 1111 was charged twice",
		"4111111111111111",
		"連絡先: jane@example.com です",                                            // unicode around it
		"naïve café — 東京 🚀 +44 20 7946 0958",                                  // unicode before it
		strings.Repeat("cite the refund policy; ", 3000) + "jane@example.com", // ~70 KB, at the end
		"jane@example.com" + strings.Repeat(" ✓ résumé", 2000),                // long, at the start
		"employee EMP-123456 asked",                                           // the custom pattern only
	}
	// None holds personal data on its own, though some are halves of some that do.
	cleanTexts = []string{
		"plain prose", "naïve café — 東京 🚀", "order 12345 of ticket 678", "ping @support-leads",
		"jane.doe@", "example.com", "4111 1111", "1111 1111", "+1 415", "555 0100",
		strings.Repeat("x", 1<<14), "EMP-12", "customer_id:cus_9",
	}
)

// filler fills the free-text fields and the message fields of a message at random, and
// records each (message type, field) it put personal data in within the screened depth.
type filler struct {
	rng   *rand.Rand
	dirty map[string]bool
}

func (f *filler) text(key string, depth int) string {
	if f.rng.IntN(3) == 0 {
		if depth <= 4 {
			f.dirty[key] = true
		}
		return dirtyTexts[f.rng.IntN(len(dirtyTexts))]
	}
	return cleanTexts[f.rng.IntN(len(cleanTexts))]
}

// fill fills r, whose depth (0: the top) may go past the screened 4, so data just beyond it
// must be missed by both.
func (f *filler) fill(r protoreflect.Message, depth int) {
	p := planOf(r.Descriptor())
	for _, fd := range p.texts {
		if f.rng.IntN(4) == 0 {
			continue
		}
		key := string(r.Descriptor().FullName()) + "." + string(fd.Name())
		if !fd.IsList() {
			r.Set(fd, protoreflect.ValueOfString(f.text(key, depth)))
			continue
		}
		l := r.Mutable(fd).List()
		for range 1 + f.rng.IntN(3) {
			l.Append(protoreflect.ValueOfString(f.text(key, depth)))
		}
	}
	if depth >= 6 {
		return
	}
	for _, fd := range p.msgs {
		if f.rng.IntN(3) == 0 {
			continue
		}
		if fd.ContainingOneof() != nil && r.WhichOneof(fd.ContainingOneof()) != nil {
			continue
		}
		if !fd.IsList() {
			f.fill(r.Mutable(fd).Message(), depth+1)
			continue
		}
		l := r.Mutable(fd).List()
		for range 1 + f.rng.IntN(3) {
			f.fill(l.AppendMutable().Message(), depth+1)
		}
	}
}

type refKeeper struct{ n int }

func (k *refKeeper) Keep(_ context.Context, _, kind, _ string) (string, error) {
	k.n++
	return fmt.Sprintf("pii:%s-%d", kind, k.n), nil
}

// TestScreenAgreesWithTheFullWalk: over generated messages of every type a scan sees, with
// personal data (on its own, in unicode, at either end of very long text, split across two
// fields, past the walk's depth) in every screened field of every nested and repeated
// message: the screen says found exactly when the full walk finds something, and Scan and
// Redact report exactly the full walk's findings, with nothing left after Redact.
func TestScreenAgreesWithTheFullWalk(t *testing.T) {
	custom, err := New(Pattern{Name: "employee_id", Regex: `EMP-\d{6}`})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range dirtyTexts {
		if custom.Find(s) == nil {
			t.Fatalf("sample %.40q: no personal data found; the generator is wrong", s)
		}
	}
	for _, s := range cleanTexts {
		if custom.Find(s) != nil {
			t.Fatalf("sample %.40q: personal data found; the generator is wrong", s)
		}
	}
	types := []proto.Message{&handoffv1.HandoffPackage{}, &handoffv2.HandoffPackage{}, &handoffv1.SubmitJobRequest{},
		&handoffv1.StageResult{}, &handoffv1.ResolveEscalationRequest{}}
	for _, typ := range types {
		name := string(typ.ProtoReflect().Descriptor().FullName())
		t.Run(name, func(t *testing.T) {
			f := &filler{dirty: map[string]bool{}}
			found, clean := 0, 0
			for seed := range uint64(60) {
				f.rng = rand.New(rand.NewPCG(seed, 22))
				m := typ.ProtoReflect().New().Interface()
				f.fill(m.ProtoReflect(), 0)
				for _, d := range []*Detector{Builtin(), custom} {
					want := refWalk(d, m)
					if got := d.screen(m.ProtoReflect(), 4); got != (len(want) > 0) {
						t.Fatalf("seed %d: screen = %v; the full walk found %v", seed, got, want)
					}
					testkit.Equal(t, d.Scan(m), want, fmt.Sprintf("seed %d: Scan's findings", seed))
					c := proto.Clone(m)
					red, err := d.Redact(context.Background(), c, "job", &refKeeper{})
					if err != nil {
						t.Fatal(err)
					}
					testkit.Equal(t, red, want, fmt.Sprintf("seed %d: Redact's findings", seed))
					if left := refWalk(d, c); left != nil {
						t.Fatalf("seed %d: after Redact the full walk still finds %v", seed, left)
					}
					if len(want) > 0 {
						found++
					} else {
						clean++
					}
				}
			}
			if found == 0 || clean == 0 {
				t.Errorf("%d messages with findings, %d without; want both", found, clean)
			}
			// Every screened (type, field) within the depth had personal data at least once.
			var missing []string
			var reach func(md protoreflect.MessageDescriptor, depth int, seen map[protoreflect.FullName]int)
			reach = func(md protoreflect.MessageDescriptor, depth int, seen map[protoreflect.FullName]int) {
				if d, ok := seen[md.FullName()]; ok && d <= depth {
					return
				}
				seen[md.FullName()] = depth
				p := planOf(md)
				for _, fd := range p.texts {
					if k := string(md.FullName()) + "." + string(fd.Name()); !f.dirty[k] {
						missing = append(missing, k)
					}
				}
				if depth < 4 {
					for _, fd := range p.msgs {
						reach(fd.Message(), depth+1, seen)
					}
				}
			}
			reach(typ.ProtoReflect().Descriptor(), 0, map[protoreflect.FullName]int{})
			if len(missing) > 0 {
				t.Errorf("no personal data generated in %v", missing)
			}
		})
	}
}
