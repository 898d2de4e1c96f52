package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// module is the import path the service binaries are built from.
const module = "github.com/handoffhq/handoff"

// build compiles the commands binaries (cmd/<name> each: the layout's) into dir with one
// `go build`, with crash points (-tags crashpoints: the writeback reports them to the
// harness's hook, which kills it there; see internal/crashpoint). It must run inside the
// handoff module's source tree (any folder of it).
func build(ctx context.Context, dir string, binaries []string) error {
	args := []string{"build", "-tags", "crashpoints", "-o", dir + string(filepath.Separator)}
	for _, b := range binaries {
		args = append(args, module+"/cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %v\n%s(run it inside the handoff source tree, or give prebuilt binaries with --bin DIR)", strings.Join(args, " "), err, out)
	}
	return nil
}

// freePort returns a loopback port nothing listened on a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// proc is one service process under a supervisor: started again after the harness kills it
// (at once) or after it exits by itself (a second later, as systemd or Kubernetes would;
// counted as a crash, since the harness did not cause it: a service that cannot reach Redis
// at start exits, for one).
type proc struct {
	name, kind string // "coordinator-2", "coordinator"
	bin        string
	args       []string
	env        []string // added to the harness's environment
	addr       string
	logPath    string
	say        func(format string, args ...any)
	health     healthpb.HealthClient
	conn       *grpc.ClientConn

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	exitErr  error
	healthy  bool // reported SERVING since its last start
	killing  bool
	stopping bool
	crashes  int
	starts   int
	done     chan struct{} // closed when the supervisor returns
	stopped  string        // how the final stop went
}

// dial are more options of the health connection (mkOneProcess's rpc.Reconnect).
func newProc(name, kind, bin, addr, logPath string, args []string, say func(string, ...any), dial ...grpc.DialOption) (*proc, error) {
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		return nil, err
	}
	return &proc{name: name, kind: kind, bin: bin, args: args, addr: addr, logPath: logPath, say: say,
		health: healthpb.NewHealthClient(cc), conn: cc, done: make(chan struct{})}, nil
}

// start launches the process once.
func (p *proc) start() error {
	f, err := os.OpenFile(p.logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.healthy = cmd, exited, false
	p.starts++
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(exited)
	}()
	go p.watchHealth(exited)
	return nil
}

// healthPoll is how often a started process's health is asked until it answers SERVING.
// Kills are only made on a process marked healthy, and the platform takes its work back
// within a few hundred milliseconds of a restart: a coarse poll would leave a window in
// which the writes that a planned kill waits for go by unkilled.
const healthPoll = 10 * time.Millisecond

// watchHealth marks the process healthy once its gRPC health answers SERVING.
func (p *proc) watchHealth(exited chan struct{}) {
	for {
		select {
		case <-exited:
			return
		case <-time.After(healthPoll):
		}
		// The health connection backs off while the process is down (up to rpc.Reconnect's
		// 2 s): dial again now, not when the backoff ends.
		p.conn.ResetConnectBackoff()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		r, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			p.mu.Lock()
			if p.exited == exited {
				p.healthy = true
			}
			p.mu.Unlock()
			return
		}
	}
}

// supervise runs the process until stop.
func (p *proc) supervise() {
	defer close(p.done)
	for {
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if err := p.start(); err != nil {
			p.say("%s: %v", p.name, err)
			time.Sleep(time.Second)
			continue
		}
		p.mu.Lock()
		exited := p.exited
		p.mu.Unlock()
		<-exited
		p.mu.Lock()
		stopping, killed, exitErr := p.stopping, p.killing, p.exitErr
		p.killing, p.healthy = false, false
		if !killed && !stopping {
			p.crashes++
		}
		p.mu.Unlock()
		switch {
		case stopping:
			return
		case killed:
			time.Sleep(100 * time.Millisecond)
		default:
			p.say("%s exited by itself (%v); restarting in 1s (see %s)", p.name, exitErr, p.logPath)
			time.Sleep(time.Second)
		}
	}
}

// up reports whether the process is running and has answered SERVING.
func (p *proc) up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.healthy && !p.killing && !p.stopping
}

// kill SIGKILLs the process (when it is up) and returns once it has exited; the supervisor
// then starts it again. before runs just before the signal, only when it is sent.
func (p *proc) kill(before func()) bool {
	p.mu.Lock()
	if !p.healthy || p.killing || p.stopping || p.cmd == nil {
		p.mu.Unlock()
		return false
	}
	p.killing = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	before()
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return true
}

// stop sends SIGTERM and waits for a graceful exit (up to grace, then SIGKILL). It records
// how the stop went: a service that drains and exits 0 is "graceful".
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	defer p.conn.Close()
	if cmd == nil || exited == nil {
		<-p.done
		return
	}
	select {
	case <-exited: // between restarts
		p.stopped = "not running"
		<-p.done
		return
	default:
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		p.mu.Lock()
		err := p.exitErr
		p.mu.Unlock()
		if err == nil {
			p.stopped = fmt.Sprintf("graceful (exit 0 after SIGTERM in %s)", time.Since(start).Round(time.Millisecond))
		} else {
			p.stopped = fmt.Sprintf("exited after SIGTERM with %v", err)
		}
	case <-time.After(grace):
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		p.stopped = fmt.Sprintf("did not exit within %s of SIGTERM; killed", grace)
	}
	<-p.done
}

// logTail is the last n lines of the process log, for error messages.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// redisProc is a redis-server that keeps its data across restarts: append-only file with an
// fsync per write in its own folder, no RDB snapshots.
type redisProc struct {
	bin, dir, addr string
	port           int
	cmd            *exec.Cmd
	exited         chan struct{}
	restarts       *atomic.Int32
}

func (r *redisProc) start() error {
	f, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, "--port", fmt.Sprint(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", r.bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(exited) }()
	r.cmd, r.exited = cmd, exited
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := redisPing(r.addr); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer PING: %v\n%s", r.addr, err, logTail(filepath.Join(r.dir, "redis.log"), 10))
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited at start:\n%s", logTail(filepath.Join(r.dir, "redis.log"), 10))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// restart SIGKILLs the server, leaves it down for down, and starts it on the same port and
// data folder: every write it acknowledged is in the fsynced append-only file.
func (r *redisProc) restart(down time.Duration) error {
	r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.exited
	time.Sleep(down)
	r.restarts.Add(1)
	return r.start()
}

func (r *redisProc) stop() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Signal(syscall.SIGKILL)
		<-r.exited
	}
}

// redisPing sends one PING over a fresh connection.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New("unexpected reply " + strings.TrimSpace(line))
	}
	return nil
}
