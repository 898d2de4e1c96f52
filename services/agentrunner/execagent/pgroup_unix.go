//go:build unix

package execagent

import (
	"os/exec"
	"syscall"
)

// setProcessGroup starts the program in its own process group and makes cancellation kill
// the whole group, so a shell script's children (a sleep, a model client) die with it.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		// A negative pid signals the process group whose id is the child's pid.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			return cmd.Process.Kill()
		}
		return nil
	}
}
