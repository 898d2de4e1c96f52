//go:build !unix

package execagent

import "os/exec"

// setProcessGroup is a no-op where process groups are not available: cancellation kills
// the program itself (exec.CommandContext's default).
func setProcessGroup(*exec.Cmd) {}
