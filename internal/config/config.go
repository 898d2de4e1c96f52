// Package config binds service settings to flags with environment-variable fallbacks:
// a flag given on the command line wins, then the variable, then the default. Every
// setting's --help line names its variable, and a value that does not parse, from a flag or
// a variable, fails the start with a message naming the flag (and the variable).
//
// A binary's settings are one struct with two methods:
//
//	func (s *settings) Bind(b *config.Binder)  // every flag, its variable and its default
//	func (s *settings) Validate() error        // every rule between values, naming the flag
//
// and Parse runs both, so no value reaches the program unchecked and nothing reads the
// environment around the Binder.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Binder registers settings on a FlagSet and remembers the values that did not parse.
type Binder struct {
	fs      *flag.FlagSet
	errs    []error
	flagErr error             // the first flag value that did not parse, named
	kinds   map[string]string // flag name -> what --help calls its value
	envOnly []envSetting
}

type envSetting struct{ env, usage string }

// New returns a Binder for fs.
func New(fs *flag.FlagSet) *Binder { return &Binder{fs: fs, kinds: map[string]string{}} }

// FlagSet is the set the Binder registers on.
func (b *Binder) FlagSet() *flag.FlagSet { return b.fs }

func (b *Binder) env(env string) (string, bool) {
	v, ok := os.LookupEnv(env)
	return v, ok && v != ""
}

func usageWithEnv(usage, env string) string { return fmt.Sprintf("%s (env %s)", usage, env) }

// String binds a string setting.
func (b *Binder) String(p *string, name, env, def, usage string) {
	if v, ok := b.env(env); ok {
		def = v
	}
	b.fs.StringVar(p, name, def, usageWithEnv(usage, env))
}

// Duration binds a duration setting ("90s", "2m"). A negative duration is refused here,
// from the flag or the variable; Validate checks the setting's own bounds.
func (b *Binder) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	if v, ok := b.env(env); ok {
		if d, err := parseDuration(v); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q (for --%s): %v", env, v, name, err))
		} else {
			def = d
		}
	}
	*p = def
	b.kinds[name] = "duration"
	b.fs.Var(&durationValue{p: p, name: name, b: b}, name, usageWithEnv(usage, env))
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("not a duration (e.g. 30s, 2m, 720h)")
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// durationValue is a flag.Value that names its flag when a value does not parse: the flag
// package's own message says "-name: parse error".
type durationValue struct {
	p    *time.Duration
	name string
	b    *Binder
}

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return d.b.failed(fmt.Errorf("--%s %q: %v", d.name, s, err))
	}
	*d.p = v
	return nil
}

func (d *durationValue) String() string {
	if d.p == nil { // flag.PrintDefaults's zero value
		return "0s"
	}
	return d.p.String()
}

func (b *Binder) failed(err error) error {
	if b.flagErr == nil {
		b.flagErr = err
	}
	return err
}

// Int binds an integer setting.
func (b *Binder) Int(p *int, name, env string, def int, usage string) {
	if v, ok := b.env(env); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q (for --%s): not an integer", env, v, name))
		} else {
			def = n
		}
	}
	b.fs.IntVar(p, name, def, usageWithEnv(usage, env))
}

// Bool binds a boolean setting.
func (b *Binder) Bool(p *bool, name, env string, def bool, usage string) {
	if v, ok := b.env(env); ok {
		x, err := strconv.ParseBool(v)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s=%q (for --%s): not true or false", env, v, name))
		} else {
			def = x
		}
	}
	b.fs.BoolVar(p, name, def, usageWithEnv(usage, env))
}

// List binds a repeatable setting: each --name adds one entry, and without any the
// variable's entries, separated by sep, are the list.
func (b *Binder) List(p *[]string, name, env, sep, usage string) {
	*p = nil
	if v, ok := b.env(env); ok {
		for _, e := range strings.Split(v, sep) {
			if e = strings.TrimSpace(e); e != "" {
				*p = append(*p, e)
			}
		}
	}
	b.kinds[name] = "value"
	b.fs.Var(&listValue{p: p}, name, fmt.Sprintf("%s (repeatable; env %s, entries separated by %q)", usage, env, sep))
}

// listValue's first Set replaces the variable's entries: flags win over the variable.
type listValue struct {
	p   *[]string
	set bool
}

func (l *listValue) Set(v string) error {
	if !l.set {
		*l.p, l.set = nil, true
	}
	*l.p = append(*l.p, v)
	return nil
}

func (l *listValue) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, "; ")
}

// Secret binds a setting read from the environment only, never from a flag: a flag's value
// shows in the process list and in shell history. --help lists it under "Environment only".
func (b *Binder) Secret(p *string, env, usage string) {
	*p, _ = b.env(env)
	b.envOnly = append(b.envOnly, envSetting{env, usage})
}

// Describe sets the --help text: its first line is "NAME: what", so whoever runs the
// binary learns what it is before anything else; details follow the usage line, then the
// flags with their variables and the environment-only settings.
func (b *Binder) Describe(what, details string) {
	b.fs.Usage = func() {
		w := b.fs.Output()
		fmt.Fprintf(w, "%s: %s\n\nUsage: %s [flags]\n", b.fs.Name(), what, b.fs.Name())
		if details != "" {
			fmt.Fprintf(w, "\n%s\n", strings.TrimRight(details, "\n"))
		}
		fmt.Fprint(w, "\nFlags (a flag wins over its variable, the variable over the default):\n")
		b.PrintDefaults(w)
		if len(b.envOnly) > 0 {
			fmt.Fprint(w, "\nEnvironment only:\n")
			for _, e := range b.envOnly {
				fmt.Fprintf(w, "  %s\n    \t%s\n", e.env, e.usage)
			}
		}
	}
}

// PrintDefaults prints every flag as flag.PrintDefaults does, with "--" and the kind of
// value of the flags bound here.
func (b *Binder) PrintDefaults(w io.Writer) {
	b.fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		if k, ok := b.kinds[f.Name]; ok && !strings.Contains(f.Usage, "`") {
			kind = k
		}
		line := "  --" + f.Name
		if kind != "" {
			line += " " + kind
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "0s" && f.DefValue != "false" && f.DefValue != "0" {
			if kind == "string" {
				line += fmt.Sprintf(" (default %q)", f.DefValue)
			} else {
				line += fmt.Sprintf(" (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w, line)
	})
}

// Parse parses args and returns every environment and flag error together; a flag value
// that does not parse is named by its flag.
func (b *Binder) Parse(args []string) error {
	if err := b.fs.Parse(args); err != nil {
		if b.flagErr != nil {
			return b.flagErr
		}
		return err
	}
	if b.fs.NArg() > 0 {
		b.errs = append(b.errs, fmt.Errorf("unexpected arguments: %v", b.fs.Args()))
	}
	return errors.Join(b.errs...)
}

// Settings is a binary's configuration: Bind registers each setting, Validate checks the
// values once they are parsed and names the flag of a bad one.
type Settings interface {
	Bind(b *Binder)
	Validate() error
}

// Load binds s on a flag set named name, parses args and validates: the one way a binary
// reads its settings. what and details are its --help (see Describe), printed with flag
// errors to out; with --help it returns flag.ErrHelp.
func Load(name string, out io.Writer, what, details string, s Settings, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	b := New(fs)
	b.Describe(what, details)
	s.Bind(b)
	if err := b.Parse(args); err != nil {
		return err
	}
	return s.Validate()
}

// HostPort checks a listen address host:port of flag (the host may be empty).
func HostPort(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--%s %q: %v", flag, addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("--%s %q: port %q is not a number from 0 to 65535", flag, addr, port)
	}
	return nil
}
