package pii_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	handoffv2 "github.com/handoffhq/handoff/gen/handoff/v2"
	"github.com/handoffhq/handoff/internal/pii"
	"github.com/handoffhq/handoff/internal/testkit"
)

func TestFind(t *testing.T) {
	for _, c := range []struct {
		name, text string
		want       []string // kind=value of each match, in order
	}{
		{"plain prose", "Draft internal triage summary; do not send to customer", nil},
		{"e-mail", "reply to jane.doe+billing@example.co.uk today", []string{"email=jane.doe+billing@example.co.uk"}},
		{"an at sign is not an address", "ping @support-leads about it", nil},
		{"a handle without a TLD is not an address", "user@localhost", nil},
		{"visa, bare", "card 4111111111111111 was charged twice", []string{"card=4111111111111111"}},
		{"visa, grouped", "card 4111 1111 1111 1111 was charged", []string{"card=4111 1111 1111 1111"}},
		{"mastercard, hyphens", "5555-5555-5555-4444", []string{"card=5555-5555-5555-4444"}},
		{"amex, 15 digits", "amex 378282246310005", []string{"card=378282246310005"}},
		{"discover", "6011111111111117", []string{"card=6011111111111117"}},
		{"a card inside a longer grouped run", "ref 12 4111 1111 1111 1111", []string{"card=4111 1111 1111 1111"}},
		{"Luhn fails: an order number", "order 1234567812345678 shipped", nil},
		{"Luhn fails by one digit", "4111111111111112", nil},
		{"Luhn holds but no card network starts with 9", "ticket 9912345678901239", nil},
		{"a digit run longer than any card", "trace 41111111111111114111111111", nil},
		{"a digit run inside a word is no card", "run_4111111111111111x", nil},
		{"e.164 phone", "call +44 20 7946 0958 after five", []string{"phone=+44 20 7946 0958"}},
		{"e.164 phone, compact", "+14155550134", []string{"phone=+14155550134"}},
		{"us phone, parentheses", "call (415) 555-0134", []string{"phone=(415) 555-0134"}},
		{"us phone, hyphens", "call 415-555-0134", []string{"phone=415-555-0134"}},
		{"national phone with spaces", "tel 020 7946 0958", []string{"phone=020 7946 0958"}},
		{"a bare ten-digit run is no phone", "order 4155550134", nil},
		{"a date is no phone", "on 2026-12-01 at 10:30", nil},
		{"money is no phone", "refund $1,196.50 of 1196500 micros", nil},
		{"a memory ref is no PII", "see customer_id:cus_9 and pii:abcdefghijklmnopqrstuvwx", nil},
		{"two kinds in one text", "mail a@b.io or call +1 415 555 0134", []string{"email=a@b.io", "phone=+1 415 555 0134"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, m := range pii.Builtin().Find(c.text) {
				got = append(got, m.Kind+"="+c.text[m.Start:m.End])
			}
			testkit.Equal(t, got, c.want, "matches")
		})
	}
}

func TestPatterns(t *testing.T) {
	d, err := pii.New(pii.Pattern{Name: "employee_id", Regex: `\bEMP-\d{3}-\d{4}\b`})
	if err != nil {
		t.Fatal(err)
	}
	text := "ask EMP-204-7781 to approve"
	ms := d.Find(text)
	if len(ms) != 1 || ms[0].Kind != "employee_id" || text[ms[0].Start:ms[0].End] != "EMP-204-7781" {
		t.Fatalf("Find = %+v, want the id as kind employee_id", ms)
	}
	if _, ok := pii.Builtin().First(text); ok {
		t.Fatal("the built-in detectors alone flag the id; the test needs a text only the pattern finds")
	}

	for _, c := range []struct {
		name string
		p    pii.Pattern
		want string // part of the error
	}{
		{"no name", pii.Pattern{Regex: "x"}, "name"},
		{"upper-case name", pii.Pattern{Name: "IBAN", Regex: "x"}, "lower-case"},
		{"a built-in name", pii.Pattern{Name: "card", Regex: "x"}, "built-in"},
		{"no regex", pii.Pattern{Name: "x"}, "regex is required"},
		{"broken regex", pii.Pattern{Name: "x", Regex: "a("}, "does not compile"},
		{"matches everything", pii.Pattern{Name: "x", Regex: "a*"}, "empty text"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := pii.New(c.p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New(%+v) = %v, want an error containing %q", c.p, err, c.want)
			}
		})
	}
}

func TestMask(t *testing.T) {
	got := pii.Builtin().Mask("model refused: card " + card + " of jane@example.com")
	if want := "model refused: card [card] of [email]"; got != want {
		t.Fatalf("Mask = %q, want %q", got, want)
	}
	if s := "nothing here 1234567812345678"; pii.Builtin().Mask(s) != s {
		t.Fatalf("Mask changed clean text %q", s)
	}
}

func TestLuhn(t *testing.T) {
	for s, want := range map[string]bool{
		"79927398713": true, "79927398710": false, "4111111111111111": true,
		"": false, "0": false, "12a4": false,
	} {
		if got := pii.Luhn(s); got != want {
			t.Errorf("Luhn(%q) = %v, want %v", s, got, want)
		}
	}
}

const (
	card      = "4111111111111111"
	piiPhoneT = "+1 415 555 0134"
)

func TestScanNamesTheFieldNeverTheValue(t *testing.T) {
	p := testkit.Package(func(p *handoffv1.HandoffPackage) {
		p.Goal = "refund card " + card
		p.Constraints = []string{"no refund promises", "mail jane@example.com"}
		p.OpenQuestions = []string{"customer timezone unknown", "call +1 415 555 0134?"}
		p.NextHint = "cite the policy"
	})
	fs := pii.Builtin().Scan(p)
	want := []pii.Finding{
		{Field: "goal", Kind: pii.KindCard},
		{Field: "constraints[1]", Kind: pii.KindEmail},
		{Field: "open_questions[1]", Kind: pii.KindPhone},
	}
	testkit.Equal(t, fs, want, "findings")

	rs := pii.Reasons("package", fs)
	if len(rs) != 3 || rs[0].GetField() != "package.goal" || rs[0].GetRule() != pii.Rule {
		t.Fatalf("Reasons = %v, want package.goal first with rule pii", rs)
	}
	for _, r := range rs {
		for _, v := range []string{card, "jane@example.com", "555 0134"} {
			if strings.Contains(r.GetMessage(), v) {
				t.Errorf("reason %q echoes the value %q", r.GetMessage(), v)
			}
		}
	}

	v2 := &handoffv2.HandoffPackage{Schema: "handoff.v2", NextHint: "card " + card}
	testkit.Equal(t, pii.Builtin().Scan(v2), []pii.Finding{{Field: "next_hint", Kind: pii.KindCard}}, "v2 findings")
	req := &handoffv1.SubmitJobRequest{Goal: "ok", Constraints: []string{"x", "y " + card}}
	testkit.Equal(t, pii.Builtin().Scan(req), []pii.Finding{{Field: "constraints[1]", Kind: pii.KindCard}}, "submit findings")
	// An operator's words and a route's reason are prose too, in the messages they are held by.
	res := &handoffv1.ResolveEscalationRequest{Operator: "ana@example.com", Comment: "called " + piiPhoneT,
		Action: &handoffv1.ResolveEscalationRequest_Fail{Fail: &handoffv1.FailAction{Reason: "card " + card + " is stolen"}}}
	testkit.Equal(t, pii.Builtin().Scan(res), []pii.Finding{{Field: "comment", Kind: pii.KindPhone}, {Field: "fail.reason", Kind: pii.KindCard}}, "resolve findings (the operator's own login is no finding)")
	sr := &handoffv1.StageResult{Route: &handoffv1.RouteChoice{Name: "billing", Reason: "mail jane@example.com"}}
	testkit.Equal(t, pii.Builtin().Scan(sr), []pii.Finding{{Field: "route.reason", Kind: pii.KindEmail}}, "route findings")
	if fs := pii.Builtin().Scan(testkit.Package()); fs != nil {
		t.Errorf("a clean package has findings: %v", fs)
	}
}

func TestRedactKeepsValuesInTheVault(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vault")
	v, err := pii.OpenVault(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := &handoffv1.SubmitJobRequest{JobId: "tkt_1", Goal: "refund " + card + " and mail jane@example.com"}
	fs, err := pii.Builtin().Redact(ctx, req, "tkt_1", v)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Equal(t, fs, []pii.Finding{{Field: "goal", Kind: pii.KindCard}}, "redacted findings")
	goal := req.GetGoal()
	if strings.Contains(goal, card) || strings.Contains(goal, "jane@") {
		t.Fatalf("goal still holds a value: %q", goal)
	}
	if fs := pii.Builtin().Scan(req); fs != nil {
		t.Fatalf("the redacted goal %q still has findings %v", goal, fs)
	}
	words := strings.Fields(goal)
	if len(words) != 5 || !strings.HasPrefix(words[1], "pii:") || !strings.HasPrefix(words[4], "pii:") {
		t.Fatalf("goal = %q, want both values replaced by pii refs in place", goal)
	}
	job, kind, value, err := v.Get(words[1])
	if err != nil || job != "tkt_1" || kind != pii.KindCard || value != card {
		t.Fatalf("Get(%s) = %q %q %q %v, want the card of tkt_1", words[1], job, kind, value, err)
	}

	// The same value of the same job is the same ref, after a reopen too; another job's is
	// another.
	v2, err := pii.OpenVault(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := v2.Keep(ctx, "tkt_1", pii.KindCard, card)
	if err != nil || again != words[1] {
		t.Fatalf("Keep again = %q %v, want %q", again, err, words[1])
	}
	other, _ := v2.Keep(ctx, "tkt_2", pii.KindCard, card)
	if other == again {
		t.Fatal("two jobs' values share a ref")
	}

	// Only the coordinator's user reads the folder, and no file is named after the value.
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("vault folder mode = %v %v, want 0700", st.Mode().Perm(), err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		info, _ := e.Info()
		if info.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", e.Name(), info.Mode().Perm())
		}
		if strings.Contains(e.Name(), "4111") {
			t.Errorf("file name %q holds digits of the value", e.Name())
		}
	}

	for _, bad := range []string{"", "pii:", "customer_id:cus_9", "pii:../key", "pii:key", "pii:ABCDEFGHIJKLMNOPQRSTUVWX"} {
		if _, _, _, err := v.Get(bad); err == nil {
			t.Errorf("Get(%q) = nil error, want a refusal", bad)
		}
	}
	if _, _, _, err := v.Get("pii:abcdefghijklmnopqrstuvwx"); !errors.Is(err, pii.ErrNotFound) {
		t.Errorf("Get(unknown ref) = %v, want ErrNotFound", err)
	}
	if _, err := pii.OpenVault(" "); err == nil {
		t.Error("OpenVault(blank) = nil error")
	}
}

type failing struct{}

func (failing) Keep(context.Context, string, string, string) (string, error) {
	return "", errors.New("disk full")
}

func TestRedactErrorNamesNoValue(t *testing.T) {
	req := &handoffv1.SubmitJobRequest{Goal: "refund " + card}
	_, err := pii.Builtin().Redact(context.Background(), req, "tkt_1", failing{})
	if err == nil || strings.Contains(err.Error(), card) || !strings.Contains(err.Error(), "goal") {
		t.Fatalf("Redact with a failing keeper = %v, want an error naming goal and not the value", err)
	}
}

type letters struct{}

func (letters) Keep(context.Context, string, string, string) (string, error) {
	return "pii:abcdefghijklmnopqrstuvwx", nil
}

func FuzzFind(f *testing.F) {
	for _, s := range []string{card, "4111 1111 1111 1111", "a@b.io", "+1 415 555 0134", "(415) 555-0134", "order 1234567812345678", "x 12 4111-1111-1111-1111 9"} {
		f.Add(s)
	}
	d := pii.Builtin()
	f.Fuzz(func(t *testing.T, s string) {
		ms := d.Find(s)
		end := 0
		for _, m := range ms {
			if m.Start < end || m.End <= m.Start || m.End > len(s) {
				t.Fatalf("Find(%q) = %+v: matches overlap or leave the text", s, ms)
			}
			end = m.End
		}
		req := &handoffv1.SubmitJobRequest{Goal: s}
		if _, err := d.Redact(context.Background(), req, "j", letters{}); err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if v := s[m.Start:m.End]; len(v) >= 8 && strings.Contains(req.GetGoal(), v) && !strings.Contains(strings.ReplaceAll(s, v, ""), v) {
				t.Fatalf("redacting %q left %q in %q", s, v, req.GetGoal())
			}
		}
	})
}

// BenchmarkScan is the check every receiver adds to each hop: a clean package of the
// demo's size.
func BenchmarkScan(b *testing.B) {
	p := testkit.Package(func(p *handoffv1.HandoffPackage) {
		p.OpenQuestions = []string{"customer timezone unknown", "which order 1234567812345678 was charged twice?"}
		p.NextHint = "cite the refund policy for the second claim"
	})
	d := pii.Builtin()
	b.ReportAllocs()
	for b.Loop() {
		if fs := d.Scan(p); fs != nil {
			b.Fatal(fs)
		}
	}
}

// hopPackage is shaped like the bench's B package: repeated prose and repeated messages
// (tools tried, artifacts), the parts a scan walks into.
func hopPackage(mods ...func(*handoffv1.HandoffPackage)) *handoffv1.HandoffPackage {
	return testkit.Package(append([]func(*handoffv1.HandoffPackage){func(p *handoffv1.HandoffPackage) {
		p.Constraints = []string{"no refund promises", "cite help center or no_match", "internal audience only", "keep under 300 words"}
		p.OpenQuestions = []string{"customer timezone unknown", "order id not confirmed by the customer"}
		p.ToolsTried = []*handoffv1.ToolAttempt{
			{Name: "tickets.get", Ok: true, Stage: "intake"},
			{Name: "kb.search", Ok: false, ErrorCode: "timeout", Stage: "retrieve", Detail: "first attempt timed out after 5s"},
			{Name: "kb.search", Ok: true, Stage: "retrieve"},
		}
		p.Artifacts = []*handoffv1.Artifact{{Type: "intake", Uri: "file:///a/intake.json"}, {Type: "chunks", Uri: "file:///a/chunks.json"}}
		p.MemoryRefs = []string{"customer_id:cus_9", "order_id:ord_77812", "locale:en-GB"}
		p.NextHint = strings.Repeat("cite the refund policy for the second claim; ", 20)
	}}, mods...)...)
}

// The clean-case screen must see every field the full walk visits: personal data in the last
// element of a repeated message, or in the last repeated string, is still found.
func TestScanScreenSeesNestedFields(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*handoffv1.HandoffPackage)
		want []pii.Finding
	}{
		{"clean", func(*handoffv1.HandoffPackage) {}, nil},
		{"last tool attempt's detail", func(p *handoffv1.HandoffPackage) { p.ToolsTried[2].Detail = "mailed jane@example.com" },
			[]pii.Finding{{Field: "tools_tried[2].detail", Kind: pii.KindEmail}}},
		{"last memory ref", func(p *handoffv1.HandoffPackage) { p.MemoryRefs[2] = "card:" + card },
			[]pii.Finding{{Field: "memory_refs[2]", Kind: pii.KindCard}}},
		{"judge's failure detail", func(p *handoffv1.HandoffPackage) {
			p.Evaluator = &handoffv1.Evaluator{Failures: []*handoffv1.Failure{{Code: "x"}, {Code: "y", Detail: "call " + piiPhoneT}}}
		}, []pii.Finding{{Field: "evaluator.failures[1].detail", Kind: pii.KindPhone}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			testkit.Equal(t, pii.Builtin().Scan(hopPackage(c.mod)), c.want, "findings")
		})
	}
}

// BenchmarkScanHop is the receiver's scan of a clean package shaped like the bench's hop.
func BenchmarkScanHop(b *testing.B) {
	p := hopPackage()
	d := pii.Builtin()
	b.ReportAllocs()
	for b.Loop() {
		if fs := d.Scan(p); fs != nil {
			b.Fatal(fs)
		}
	}
}
