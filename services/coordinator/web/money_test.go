package web

import (
	"math"
	"testing"
)

// Money is shown to the micro-dollar: $0.011 was shown as $0.01.
func TestUSDIsExact(t *testing.T) {
	for m, want := range map[int64]string{
		0: "$0.00", 11_000: "$0.011", 10_000: "$0.01", 1_500_000: "$1.50", 1: "$0.000001",
		1_234_567: "$1.234567", -11_000: "-$0.011", math.MinInt64: "-$9223372036854.775808",
	} {
		if got := usd(m); got != want {
			t.Errorf("usd(%d) = %q, want %q", m, got, want)
		}
	}
}
