// Package pii finds personal data in the free text of handoff packages and the messages that
// feed them, so that it never travels from stage to stage (overshare): e-mail addresses,
// phone numbers, payment card numbers and the patterns a pipeline file adds.
//
// Detection is a pure function of the text (Detector.Find). The detectors aim at what a
// person typed, not at every digit run:
//
//   - email: local@domain.tld, the domain with at least one dot and a letter TLD;
//   - phone: a number written as a phone number is written: "+" and 8 to 15 digits (E.164,
//     separators allowed), or national forms with separators ("(415) 555-0134",
//     "415-555-0134", "020 7946 0958"). A bare run of digits is not a phone: it is an order
//     number as often as not;
//   - card: 13 to 19 digits (single spaces or hyphens between groups allowed) that start like
//     a card of a major network (Visa, Mastercard, Amex, Discover, JCB, Diners, UnionPay)
//     and pass the Luhn check, so a random digit run trips it rarely and an order number
//     almost never.
//
// Which fields are free text is fixed here (Scan): goal, constraints, open_questions,
// next_hint and resolved_questions (a package, in both contract versions; a SubmitJobRequest;
// a StageResult; a Job), comment and reason (an operator's ResolveEscalationRequest, a
// route's reason), in the message and in the singular messages it holds.
// What happens to a finding (refused or replaced by a ref into a Vault) is the caller's
// policy. Nothing in this package puts a found value into an error, a Finding or a log line:
// a finding names the field and the kind, never the value.
package pii

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Kinds of the built-in detectors. A pipeline pattern's kind is its name.
const (
	KindEmail = "email"
	KindPhone = "phone"
	KindCard  = "card"
)

// Rule is the rule id of a finding in a handoff.v1.Reason.
const Rule = "pii"

// Match is one piece of personal data in a text: bytes [Start, End) of kind Kind.
type Match struct {
	Kind       string
	Start, End int
}

// Pattern is a detector a pipeline adds: Name becomes the finding's kind, Regex (RE2
// syntax) what it finds.
type Pattern struct {
	Name  string
	Regex string
}

// Detector finds personal data. The zero value is not usable; build one with New. It is safe
// for concurrent use.
type Detector struct {
	custom []custom
}

type custom struct {
	name string
	re   *regexp.Regexp
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// CheckPattern says what is wrong with p ("" when nothing): a name that is not a short
// lower-case word or clashes with a built-in kind, a regex that does not compile or that
// matches the empty string (it would match every text).
func CheckPattern(p Pattern) string {
	switch {
	case !nameRE.MatchString(p.Name):
		return fmt.Sprintf("name %q must be a lower-case word of at most 32 letters, digits and '_' (it names the finding)", p.Name)
	case slices.Contains([]string{KindEmail, KindPhone, KindCard}, p.Name):
		return fmt.Sprintf("name %q is a built-in detector, which always runs: give the pattern its own name", p.Name)
	case p.Regex == "":
		return "regex is required"
	}
	re, err := regexp.Compile(p.Regex)
	if err != nil {
		return fmt.Sprintf("regex does not compile (Go RE2 syntax): %v", err)
	}
	if re.MatchString("") {
		return "regex matches the empty text, so it would flag every field: make it match something"
	}
	return ""
}

// New returns a Detector running the built-in detectors and the given patterns. A pattern
// CheckPattern refuses is an error naming it.
func New(patterns ...Pattern) (*Detector, error) {
	d := &Detector{}
	for i, p := range patterns {
		if why := CheckPattern(p); why != "" {
			return nil, fmt.Errorf("pii: pattern %d (%q): %s", i, p.Name, why)
		}
		d.custom = append(d.custom, custom{name: p.Name, re: regexp.MustCompile(p.Regex)})
	}
	return d, nil
}

// Builtin is a Detector with the built-in detectors only: what every receiver checks.
func Builtin() *Detector { return &Detector{} }

var (
	emailRE = regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}`)
	// E.164 with optional separators, then national forms that carry separators.
	phoneRE = regexp.MustCompile(`\+\d(?:[ .\-]?\(?\d\)?){7,16}` +
		`|\(\d{2,5}\)[ .\-]?\d{3,4}[ .\-]\d{3,4}` +
		`|\b\d{3}[.\-]\d{3}[.\-]\d{4}\b` +
		`|\b0\d{2,4} \d{3,4} \d{3,4}\b`)
	// A digit run of card length with optional single separators; the Luhn and prefix
	// checks decide.
	cardRE = regexp.MustCompile(`\b\d(?:[ \-]?\d){12,18}\b`)
)

// Find returns the personal data in s, sorted by position, overlaps removed (the earlier,
// then longer, match wins).
func (d *Detector) Find(s string) []Match {
	var ms []Match
	// Every hop runs this on clean text: a regex runs only when the text has what its
	// match needs (enough digits, an '@').
	n := digits(s)
	if n >= 13 {
		for _, loc := range cardRE.FindAllStringIndex(s, -1) {
			ms = append(ms, cards(s, loc[0], loc[1])...)
		}
	}
	if strings.IndexByte(s, '@') >= 0 {
		for _, loc := range emailRE.FindAllStringIndex(s, -1) {
			ms = append(ms, Match{KindEmail, loc[0], loc[1]})
		}
	}
	if n >= 7 {
		for _, loc := range phoneRE.FindAllStringIndex(s, -1) {
			if n := digits(s[loc[0]:loc[1]]); n >= 7 && n <= 15 {
				ms = append(ms, Match{KindPhone, loc[0], loc[1]})
			}
		}
	}
	for _, c := range d.custom {
		for _, loc := range c.re.FindAllStringIndex(s, -1) {
			if loc[1] > loc[0] {
				ms = append(ms, Match{c.name, loc[0], loc[1]})
			}
		}
	}
	if len(ms) == 0 {
		return nil
	}
	sort.SliceStable(ms, func(i, j int) bool {
		if ms[i].Start != ms[j].Start {
			return ms[i].Start < ms[j].Start
		}
		return ms[i].End > ms[j].End
	})
	out := ms[:1]
	for _, m := range ms[1:] {
		if m.Start >= out[len(out)-1].End {
			out = append(out, m)
		}
	}
	return out
}

// Mask returns s with every piece of personal data replaced by its kind in brackets
// ("[card]"): for text that must be kept or logged but whose values need no ref, such as an
// agent's error message.
func (d *Detector) Mask(s string) string {
	ms := d.Find(s)
	if len(ms) == 0 {
		return s
	}
	var b strings.Builder
	prev := 0
	for _, m := range ms {
		b.WriteString(s[prev:m.Start])
		b.WriteString("[" + m.Kind + "]")
		prev = m.End
	}
	b.WriteString(s[prev:])
	return b.String()
}

// First returns the kind of the first piece of personal data in s; ok is false when there is
// none.
func (d *Detector) First(s string) (kind string, ok bool) {
	ms := d.Find(s)
	if len(ms) == 0 {
		return "", false
	}
	return ms[0].Kind, true
}

// cards returns the card numbers in the digit run s[start:end]: the whole run when it is
// one, else each span of whole separator-delimited groups that is ("4111 1111 1111 1111 42"
// holds one).
func cards(s string, start, end int) []Match {
	run := s[start:end]
	if isCard(run) {
		return []Match{{KindCard, start, end}}
	}
	// Group boundaries: offsets (within run) where a group starts and ends.
	type group struct{ from, to int }
	var gs []group
	from := 0
	for i := 0; i < len(run); i++ {
		if run[i] == ' ' || run[i] == '-' {
			gs = append(gs, group{from, i})
			from = i + 1
		}
	}
	gs = append(gs, group{from, len(run)})
	for i := range gs {
		for j := len(gs) - 1; j >= i; j-- {
			if i == 0 && j == len(gs)-1 {
				continue
			}
			span := run[gs[i].from:gs[j].to]
			if isCard(span) {
				return []Match{{KindCard, start + gs[i].from, start + gs[j].to}}
			}
		}
	}
	return nil
}

// isCard reports whether s (digits, maybe single spaces or hyphens) is a card number: 13 to
// 19 digits, a major network's prefix, and a valid Luhn check digit.
func isCard(s string) bool {
	ds := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
	return len(ds) >= 13 && len(ds) <= 19 && network(ds) && Luhn(ds)
}

// network reports whether the digits start like a card of a major network (by IIN range).
func network(ds string) bool {
	p := func(n int) int {
		v := 0
		for _, c := range ds[:n] {
			v = v*10 + int(c-'0')
		}
		return v
	}
	switch {
	case ds[0] == '4': // Visa
		return true
	case p(2) >= 51 && p(2) <= 55, p(4) >= 2221 && p(4) <= 2720: // Mastercard
		return true
	case p(2) == 34 || p(2) == 37: // Amex
		return true
	case p(4) == 6011 || p(2) == 65 || (p(3) >= 644 && p(3) <= 649): // Discover
		return true
	case p(4) >= 3528 && p(4) <= 3589: // JCB
		return true
	case p(2) == 36 || p(2) == 38 || (p(3) >= 300 && p(3) <= 305): // Diners
		return true
	case p(2) == 62: // UnionPay
		return true
	}
	return false
}

// Luhn reports whether the decimal digits ds end in a valid Luhn check digit. Anything but
// digits, or fewer than two, is false.
func Luhn(ds string) bool {
	if len(ds) < 2 {
		return false
	}
	sum := 0
	for i := 0; i < len(ds); i++ {
		c := ds[len(ds)-1-i]
		if c < '0' || c > '9' {
			return false
		}
		d := int(c - '0')
		if i%2 == 1 {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return sum%10 == 0
}

func digits(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] >= '0' && s[i] <= '9' {
			n++
		}
	}
	return n
}

// Describe is the human name of a kind, for messages: "a payment card number".
func Describe(kind string) string {
	switch kind {
	case KindEmail:
		return "an e-mail address"
	case KindPhone:
		return "a phone number"
	case KindCard:
		return "a payment card number"
	}
	return fmt.Sprintf("personal data (pattern %q)", kind)
}
