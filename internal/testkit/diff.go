package testkit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

// Diff is cmp.Diff with protocmp: "" when want and got are equal messages (or slices,
// maps and structs of them), else the difference, "-want +got".
func Diff(want, got any) string {
	return cmp.Diff(want, got, protocmp.Transform())
}

// Equal reports whether got equals want (see Diff), failing the test with what and the
// difference when not. The test goes on; stop it with `if !Equal(...) { t.FailNow() }`.
func Equal(t testing.TB, got, want any, what string) bool {
	t.Helper()
	if d := Diff(want, got); d != "" {
		t.Errorf("%s differs (-want +got):\n%s", what, d)
		return false
	}
	return true
}
