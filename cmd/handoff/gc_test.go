package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The handoff binary reads GOGC and AUTOMEMLIMIT before any command (gctune): a value it
// cannot use stops it with exit 2 and the value named, instead of a silent GOGC=100.
func TestMain(m *testing.M) {
	if os.Getenv("HANDOFF_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"handoff"}, strings.Fields(os.Getenv("HANDOFF_TEST_ARGS"))...)
		main()
		return
	}
	os.Exit(m.Run())
}

func TestMainRefusesBadGCSettings(t *testing.T) {
	for _, c := range []struct {
		env      string
		wantCode int
		want     string
	}{
		{"GOGC=fast", 2, `handoff: GOGC="fast": want a whole number of percent`},
		{"AUTOMEMLIMIT=1.5", 2, `handoff: AUTOMEMLIMIT="1.5": want off or the share`},
		{"GOGC=200", 0, "handoff.v1"}, // accepted: the command runs (schema prints the v1 JSON Schema)
	} {
		t.Run(c.env, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "HANDOFF_TEST_RUN_MAIN=1", "HANDOFF_TEST_ARGS=schema handoff.v1", c.env)
			out, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.wantCode || !strings.Contains(string(out), c.want) {
				t.Fatalf("exit %d, output %.300q; want exit %d and %q", code, out, c.wantCode, c.want)
			}
		})
	}
}
