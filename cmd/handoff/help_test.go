package main

import (
	"bytes"
	"strings"
	"testing"
)

// Every command's --help says what the command is on its first line, in the words of the
// overview, and exits 0.
func TestHelpSaysWhatItIs(t *testing.T) {
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		if code := run([]string{c.name, "--help"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
			t.Errorf("handoff %s --help exits %d; want 0", c.name, code)
		}
		out := stdout.String() + stderr.String()
		first, _, _ := strings.Cut(out, "\n")
		if want := "handoff " + c.name + ": " + c.what; first != want {
			t.Errorf("handoff %s --help starts %q; want %q", c.name, first, want)
		}
		if !strings.Contains(out, "Usage: handoff "+c.name) {
			t.Errorf("handoff %s --help has no usage line:\n%s", c.name, out)
		}
		if !strings.Contains(usage, "handoff "+c.name+" ") {
			t.Errorf("the overview does not list %s", c.name)
		}
	}
}
