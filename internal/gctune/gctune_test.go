package gctune

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// The policy is process-wide, so each case runs in a child process of this test binary
// with its own environment, and the child reports what it set and what the runtime has.

type childOut struct {
	Policy   Policy
	Err      string
	Percent  int   // the runtime's GOGC after apply
	MemLimit int64 // the runtime's soft limit after apply
}

const childEnv = "GCTUNE_TEST_CHILD"

func TestChild(t *testing.T) {
	prov := os.Getenv(childEnv)
	if prov == "" {
		t.Skip("runs only as the child of TestApply")
	}
	provider := memlimit.Provider(func() (uint64, error) { return 0, memlimit.ErrNoLimit })
	if prov != "nolimit" {
		n, err := strconv.ParseUint(prov, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		provider = memlimit.Limit(n)
	}
	var out childOut
	p, err := apply(provider)
	out.Policy = p
	if err != nil {
		out.Err = err.Error()
	}
	out.Percent = debug.SetGCPercent(100)
	out.MemLimit = debug.SetMemoryLimit(-1)
	b, _ := json.Marshal(out)
	os.Stdout.Write(append(append([]byte("CHILD "), b...), '\n'))
}

func run(t *testing.T, provider string, env ...string) childOut {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	for _, kv := range os.Environ() { // the case's own GC settings only
		if k, _, _ := strings.Cut(kv, "="); k != "GOGC" && k != "GOMEMLIMIT" && k != "AUTOMEMLIMIT" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv+"="+provider)
	cmd.Env = append(cmd.Env, env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	_, js, ok := strings.Cut(string(b), "CHILD ")
	if !ok {
		t.Fatalf("child printed no result:\n%s", b)
	}
	js, _, _ = strings.Cut(js, "\n")
	var out childOut
	if err := json.Unmarshal([]byte(js), &out); err != nil {
		t.Fatalf("child result %q: %v", js, err)
	}
	return out
}

func TestApply(t *testing.T) {
	const gib = 1 << 30
	none := int64(math.MaxInt64)
	for _, c := range []struct {
		name      string
		provider  string // the container's limit in bytes, or nolimit
		env       []string
		gogc      int
		gogcFrom  string
		limit     int64
		limitFrom string
		err       string
	}{
		{"defaults in a container", strconv.Itoa(gib), nil, DefaultGOGC, "default", gib * 9 / 10, "cgroup", ""},
		{"defaults without a container limit", "nolimit", nil, DefaultGOGC, "default", none, "none", ""},
		{"the operator's GOGC", strconv.Itoa(gib), []string{"GOGC=50"}, 50, "GOGC", gib * 9 / 10, "cgroup", ""},
		{"GOGC off", "nolimit", []string{"GOGC=off"}, -1, "GOGC", none, "none", ""},
		{"the operator's GOMEMLIMIT wins over the container's", strconv.Itoa(gib), []string{"GOMEMLIMIT=256MiB"}, DefaultGOGC, "default", 256 << 20, "GOMEMLIMIT", ""},
		{"AUTOMEMLIMIT=off keeps no limit", strconv.Itoa(gib), []string{"AUTOMEMLIMIT=off"}, DefaultGOGC, "default", none, "AUTOMEMLIMIT=off", ""},
		{"AUTOMEMLIMIT as a share", strconv.Itoa(gib), []string{"AUTOMEMLIMIT=0.5"}, DefaultGOGC, "default", gib / 2, "cgroup", ""},
		{"an empty AUTOMEMLIMIT is unset", strconv.Itoa(gib), []string{"AUTOMEMLIMIT="}, DefaultGOGC, "default", gib * 9 / 10, "cgroup", ""},
		{"an empty GOGC is unset", "nolimit", []string{"GOGC="}, DefaultGOGC, "default", none, "none", ""},
		{"a GOGC that is no number", strconv.Itoa(gib), []string{"GOGC=fast"}, 100, "", none, "", `GOGC="fast": want a whole number of percent`},
		{"a negative GOGC", strconv.Itoa(gib), []string{"GOGC=-5"}, -1, "", none, "", `GOGC="-5"`},
		// The runtime reads only a lowercase off and a 32-bit number; it runs anything else
		// at 100, so these are refused too rather than reported as what they say.
		{"GOGC=OFF", strconv.Itoa(gib), []string{"GOGC=OFF"}, 100, "", none, "", `GOGC="OFF"`},
		{"a GOGC over 32 bits", strconv.Itoa(gib), []string{"GOGC=4294967296"}, 100, "", none, "", `GOGC="4294967296"`},
		{"an AUTOMEMLIMIT out of range", strconv.Itoa(gib), []string{"AUTOMEMLIMIT=2"}, DefaultGOGC, "", none, "", `AUTOMEMLIMIT="2": want off or the share`},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := run(t, c.provider, c.env...)
			if c.err != "" {
				if !strings.Contains(out.Err, c.err) {
					t.Fatalf("error %q, want it to say %q", out.Err, c.err)
				}
				if out.MemLimit != none {
					t.Errorf("a refused policy set a memory limit %d", out.MemLimit)
				}
				return
			}
			if out.Err != "" {
				t.Fatalf("error %s", out.Err)
			}
			if out.Policy.GOGC != c.gogc || out.Policy.GOGCFrom != c.gogcFrom || out.Percent != c.gogc {
				t.Errorf("GOGC %d from %q (runtime %d), want %d from %q", out.Policy.GOGC, out.Policy.GOGCFrom, out.Percent, c.gogc, c.gogcFrom)
			}
			if out.Policy.MemLimit != c.limit || out.Policy.MemLimitFrom != c.limitFrom || out.MemLimit != c.limit {
				t.Errorf("limit %d from %q (runtime %d), want %d from %q", out.Policy.MemLimit, out.Policy.MemLimitFrom, out.MemLimit, c.limit, c.limitFrom)
			}
		})
	}
}

func TestGOGCRule(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
		from string
		bad  bool
	}{
		{"", DefaultGOGC, "default", false},
		{"200", 200, "GOGC", false},
		{"0", 0, "GOGC", false},
		{"off", -1, "GOGC", false},
		{"+50", 50, "GOGC", false},
		{"OFF", 0, "", true},
		{"4294967296", 0, "", true},
		{"1e3", 0, "", true},
	} {
		got, from, err := gogc(c.env)
		if (err != nil) != c.bad || got != c.want || from != c.from {
			t.Errorf("gogc(%q) = %d, %q, %v; want %d, %q, bad=%v", c.env, got, from, err, c.want, c.from, c.bad)
		}
	}
}
