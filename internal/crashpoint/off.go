//go:build !crashpoints

package crashpoint

// Enabled reports whether this binary was built with crash points (-tags crashpoints).
const Enabled = false

// Hit does nothing: this build has no crash points.
func Hit(point, key string) {}
