// Package traceparent makes and reads W3C Trace Context traceparent values
// ("00-<trace id>-<parent id>-<flags>"). The rail keeps one trace id for a whole job and
// gives every hop its own parent (span) id, so a trace viewer shows the hops in order.
package traceparent

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

var format = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$`)

const (
	zeroTrace = "00000000000000000000000000000000"
	zeroSpan  = "0000000000000000"
)

// Parse splits a traceparent into its trace id, parent id and flags, and rejects the forms
// the W3C spec calls invalid (wrong shape, upper case, all-zero ids).
func Parse(tp string) (traceID, parentID, flags string, err error) {
	m := format.FindStringSubmatch(tp)
	if m == nil {
		return "", "", "", fmt.Errorf("traceparent %q is not 00-<32 hex>-<16 hex>-<2 hex>", tp)
	}
	if m[1] == zeroTrace || m[2] == zeroSpan {
		return "", "", "", fmt.Errorf("traceparent %q has an all-zero id", tp)
	}
	return m[1], m[2], m[3], nil
}

// Valid reports whether tp parses.
func Valid(tp string) bool {
	_, _, _, err := Parse(tp)
	return err == nil
}

// TraceID returns the trace id of tp, or "" when tp is invalid.
func TraceID(tp string) string {
	id, _, _, err := Parse(tp)
	if err != nil {
		return ""
	}
	return id
}

func randomHex(n int) string {
	for {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			panic("traceparent: crypto/rand failed: " + err.Error())
		}
		s := hex.EncodeToString(b)
		if strings.Trim(s, "0") != "" {
			return s
		}
	}
}

// New starts a new sampled trace.
func New() string {
	return "00-" + randomHex(16) + "-" + randomHex(8) + "-01"
}

// Child keeps tp's trace id and flags with a fresh parent id: the traceparent of the next
// hop. An invalid tp starts a new trace.
func Child(tp string) string {
	id, _, flags, err := Parse(tp)
	if err != nil {
		return New()
	}
	return "00-" + id + "-" + randomHex(8) + "-" + flags
}
