package traceparent

import "testing"

func TestParse(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := Valid(tt.in); got != tt.ok {
			t.Errorf("Valid(%q) = %v, want %v", tt.in, got, tt.ok)
		}
	}
}

func TestChildKeepsTraceID(t *testing.T) {
	root := New()
	if !Valid(root) {
		t.Fatalf("New() = %q is invalid", root)
	}
	c := Child(root)
	if TraceID(c) != TraceID(root) || c == root {
		t.Fatalf("Child(%q) = %q: want same trace id, new parent id", root, c)
	}
	if n := Child("garbage"); !Valid(n) || TraceID(n) == TraceID(root) {
		t.Fatalf("Child(garbage) = %q: want a new valid trace", n)
	}
}
