// Package config binds service settings to flags with environment-variable fallbacks:
// a flag given on the command line wins, then the variable, then the default. Every
// setting's --help line names its variable, and a variable that does not parse fails the
// start with a message naming both.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Binder registers settings on a FlagSet and remembers environment values that did not parse.
type Binder struct {
	fs   *flag.FlagSet
	errs []error
}

// New returns a Binder for fs.
func New(fs *flag.FlagSet) *Binder { return &Binder{fs: fs} }

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

// Duration binds a duration setting ("90s", "2m").
func (b *Binder) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	if v, ok := b.env(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			b.errs = append(b.errs, fmt.Errorf("%s=%q (for --%s): not a duration like 30s or 2m", env, v, name))
		} else {
			def = d
		}
	}
	b.fs.DurationVar(p, name, def, usageWithEnv(usage, env))
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

// Parse parses args and returns every environment and flag error together.
func (b *Binder) Parse(args []string) error {
	if err := b.fs.Parse(args); err != nil {
		return err
	}
	if b.fs.NArg() > 0 {
		b.errs = append(b.errs, fmt.Errorf("unexpected arguments: %v", b.fs.Args()))
	}
	return errors.Join(b.errs...)
}
