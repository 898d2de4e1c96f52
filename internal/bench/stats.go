package bench

import (
	"math"
	"slices"
	"time"
)

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of sorted; 0 when empty.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Quantiles returns the p50 and p99 (nearest rank) of samples, leaving samples as they are.
func Quantiles(samples []time.Duration) (p50, p99 time.Duration) {
	return quantiles(slices.Clone(samples))
}

// quantiles sorts samples in place and returns p50 and p99.
func quantiles(samples []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(samples)
	return percentile(samples, 0.50), percentile(samples, 0.99)
}

func micros(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)*10) / 10 }
