// Package execagent plugs any program in as a stage agent: the program reads the package on
// stdin and writes one StageResult on stdout, both in protojson (proto field names).
//
// Protocol:
//
//   - stdin: the HandoffPackage as protojson with snake_case names, then EOF;
//   - environment: exactly the env given to New, plus PATH (when env does not set it) and
//     HANDOFF_JOB_ID, HANDOFF_STAGE, HANDOFF_ROUND, HANDOFF_OPERATOR_RETURNS (how many times
//     a person sent the job back to a stage: a program that names its own files should
//     use it with the round, so a re-run does not overwrite the run it replaces),
//     HANDOFF_VISIT (likewise, for a stage a route sent the job back to), HANDOFF_ROUTES
//     (the names of the routes the stage declares, comma-separated, empty for none: a
//     program given routes answers one of them in the result's route) and, when the
//     runner's artifact store is a folder, HANDOFF_ARTIFACTS_DIR. The runner's own
//     environment (API keys and the like) is not passed on;
//   - stdout: exactly one StageResult in protojson (unknown fields are an error), at most
//     1 MiB. Its artifacts are references the program stored itself; job_id and stage may be
//     left empty (the runner fills them) but must match the package when set;
//   - exit status 0. Anything else, a timeout (the whole process group is killed), output
//     that is not a StageResult or breaks its rules is an error naming the cause, with the
//     last 4 KiB of stderr; the runner turns it into a STAGE_STATUS_FAILED result.
package execagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/contract"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// Limits on what the program may print.
const (
	MaxStdout  = 1 << 20 // a StageResult holds references, not payloads
	StderrTail = 4 << 10 // how much of stderr an error carries
)

// DefaultTimeout applies when New gets a zero timeout. The runner's stage timeout still
// bounds the run from outside.
const DefaultTimeout = 60 * time.Second

// Agent runs one program per package.
type Agent struct {
	card    agentrunner.RoleCard
	argv    []string
	timeout time.Duration
	env     []string
	v       *contract.Validator
}

// New returns an Agent that runs argv (argv[0] is looked up in PATH when it has no slash)
// with the given environment (see the package doc). A zero timeout means DefaultTimeout.
func New(card agentrunner.RoleCard, argv []string, timeout time.Duration, env []string) (*Agent, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("execagent: empty argv")
	}
	if card.Name == "" {
		return nil, errors.New("execagent: role card has no name")
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, fmt.Errorf("execagent: %w", err)
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	v, err := contract.NewValidator()
	if err != nil {
		return nil, fmt.Errorf("execagent: %w", err)
	}
	for _, kv := range env {
		if !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("execagent: env entry %q is not KEY=VALUE", kv)
		}
	}
	return &Agent{card: card, argv: append([]string(nil), argv...), timeout: timeout, env: append([]string(nil), env...), v: v}, nil
}

// Card implements agentrunner.Agent.
func (a *Agent) Card() agentrunner.RoleCard { return a.card }

// Run implements agentrunner.Agent.
func (a *Agent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	p := in.Package
	stdin, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("exec %s: encoding the package: %w", a.argv[0], err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()

	cmd := exec.CommandContext(ctx, a.argv[0], a.argv[1:]...)
	cmd.Env = a.environ(in)
	cmd.Stdin = bytes.NewReader(stdin)
	stdout := &capped{max: MaxStdout}
	stderr := &tail{max: StderrTail}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	setProcessGroup(cmd)
	// If a grandchild keeps the pipes open after the kill, stop waiting for it.
	cmd.WaitDelay = 2 * time.Second

	start := time.Now()
	runErr := cmd.Run()
	fail := func(format string, args ...any) error {
		msg := fmt.Sprintf("exec %s: %s", a.argv[0], fmt.Sprintf(format, args...))
		if s := strings.TrimSpace(stderr.String()); s != "" {
			msg += "; stderr: " + s
		}
		return errors.New(msg)
	}
	switch {
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fail("timed out after %s (process group killed)", time.Since(start).Round(time.Millisecond))
	case ctx.Err() != nil:
		return nil, fail("cancelled: %v", ctx.Err())
	case runErr != nil:
		var ee *exec.ExitError
		if errors.As(runErr, &ee) {
			return nil, fail("exited with %s", ee.ProcessState)
		}
		return nil, fail("%v", runErr)
	case stdout.over:
		return nil, fail("stdout is larger than %d bytes", MaxStdout)
	}

	out := bytes.TrimSpace(stdout.Bytes())
	if len(out) == 0 {
		return nil, fail("printed no StageResult on stdout")
	}
	res := &handoffv1.StageResult{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(out, res); err != nil {
		return nil, fail("stdout is not one StageResult in protojson: %v (stdout starts %q)", err, head(out, 120))
	}
	if err := a.v.Validate(res); err != nil {
		return nil, fail("StageResult is invalid: %v", err)
	}
	if res.JobId != "" && res.JobId != p.GetJobId() {
		return nil, fail("StageResult is for job_id %q, the package is %q", res.JobId, p.GetJobId())
	}
	if res.Stage != "" && res.Stage != p.GetStage() {
		return nil, fail("StageResult is for stage %q, the package is %q", res.Stage, p.GetStage())
	}
	return res, nil
}

func (a *Agent) environ(in agentrunner.Input) []string {
	env := append([]string(nil), a.env...)
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	if !has("PATH") {
		env = append(env, "PATH="+os.Getenv("PATH"))
	}
	env = append(env,
		"HANDOFF_JOB_ID="+in.Package.GetJobId(),
		"HANDOFF_STAGE="+in.Package.GetStage(),
		"HANDOFF_ROUND="+strconv.FormatUint(uint64(in.Round), 10),
		"HANDOFF_OPERATOR_RETURNS="+strconv.FormatUint(uint64(in.Package.GetOperatorReturns()), 10),
		"HANDOFF_VISIT="+strconv.FormatUint(uint64(in.Package.GetVisit()), 10),
		"HANDOFF_ROUTES="+routeNames(in.Routes),
	)
	// A folder store, also behind artifact.WithCompletion.
	if f, ok := in.Artifacts.(interface{ Root() string }); ok && f.Root() != "" {
		env = append(env, "HANDOFF_ARTIFACTS_DIR="+f.Root())
	}
	return env
}

// capped keeps up to max bytes and remembers whether more was written. It never fails a
// write, so the program is not killed by SIGPIPE before we can report the real cause. (It
// must not embed bytes.Buffer: io.Copy would use the promoted ReadFrom and skip the cap.)
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(b []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(b) {
		c.over = true
		if room > 0 {
			c.buf.Write(b[:room])
		}
		return len(b), nil
	}
	return c.buf.Write(b)
}

func (c *capped) Bytes() []byte { return c.buf.Bytes() }

// tail keeps the last max bytes written.
type tail struct {
	buf []byte
	max int
}

func (t *tail) Write(b []byte) (int, error) {
	n := len(b)
	if len(b) >= t.max {
		t.buf = append(t.buf[:0], b[len(b)-t.max:]...)
		return n, nil
	}
	t.buf = append(t.buf, b...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return n, nil
}

func (t *tail) String() string { return strings.ToValidUTF8(string(t.buf), "?") }

func head(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return strings.ToValidUTF8(string(b), "?")
}

// routeNames lists the stage's route names for HANDOFF_ROUTES.
func routeNames(rs []*handoffv1.RouteOption) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.GetName()
	}
	return strings.Join(names, ",")
}
