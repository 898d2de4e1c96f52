package chaos

import "syscall"

// sysProcAttr makes a child die with the harness (Pdeathsig), so a harness that is itself
// killed leaves no services or redis-server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
