package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// defaultRedisPrefix starts every key of a Redis store opened from a --store URL that names
// no prefix, so every process of one deployment shares the same keys.
const defaultRedisPrefix = "handoff:"

// openRedisTimeout bounds connecting to a Redis named by a --store URL.
const openRedisTimeout = 10 * time.Second

// OpenURL opens the store a --store setting names, the one reading of that setting for every
// binary:
//
//   - redis://[:password@]host:port[/db][?prefix=P] is Redis, what several processes share.
//     The password is the default user's (a user name other than "default" is refused, as
//     RedisOptions has none); host and port are required; db is a number from 0 (default 0);
//     prefix starts every key (default "handoff:") and is the only query parameter; a
//     fragment is refused. Connecting is bounded by 10s on top of ctx.
//   - anything without "://" is a bbolt file path (one process); its parent folder is
//     created.
//
// A setting that is neither (another scheme, a bad URL) is an error. Errors name the setting
// with its password redacted (see Redact); ParseURL checks a setting without opening it.
func OpenURL(ctx context.Context, spec string) (Store, error) {
	o, err := ParseURL(spec)
	if err != nil {
		return nil, err
	}
	if o == nil {
		if err := os.MkdirAll(filepath.Dir(spec), 0o755); err != nil {
			return nil, fmt.Errorf("%q: %w", spec, err)
		}
		st, err := Open(spec) // its errors name the path
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, openRedisTimeout)
	defer cancel()
	st, err := OpenRedis(ctx, *o)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", Redact(spec), err)
	}
	return st, nil
}

// ParseURL checks a --store setting (see OpenURL) without opening anything: for a redis://
// URL it returns the options OpenURL connects with (Prefix always set), for a bbolt file path
// nil. Errors name the setting with its password redacted.
func ParseURL(spec string) (*RedisOptions, error) {
	if spec == "" {
		return nil, errors.New("no store given: want a bbolt file path or redis://[:password@]host:port[/db]")
	}
	if !strings.Contains(spec, "://") {
		return nil, nil
	}
	shown := Redact(spec)
	fail := func(format string, args ...any) (*RedisOptions, error) {
		return nil, fmt.Errorf("%q: "+format, append([]any{shown}, args...)...)
	}
	u, err := url.Parse(spec)
	if err != nil {
		// A *url.Error repeats the URL, password and all: keep only what went wrong.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fail("neither a file path nor a redis:// URL: %v", err)
	}
	if u.Scheme != "redis" {
		return fail("only redis://[:password@]host:port[/db] URLs are supported (or give a bbolt file path)")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if u.Opaque != "" || err != nil || host == "" || port == "" {
		return fail("want redis://[:password@]host:port[/db] with a host and a port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fail("port %q is not a number from 0 to 65535", port)
	}
	if strings.Contains(spec, "#") {
		return fail("a fragment is not supported")
	}
	o := &RedisOptions{Addr: u.Host, Prefix: defaultRedisPrefix}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return fail("query: %v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k != "prefix" {
			return fail("query parameter %q is not supported (only prefix)", k)
		}
	}
	if v, ok := q["prefix"]; ok {
		if len(v) != 1 || v[0] == "" {
			return fail("prefix wants one non-empty value")
		}
		o.Prefix = v[0]
	}
	if u.User != nil {
		if name := u.User.Username(); name != "" && name != "default" {
			return fail("a user name is not supported; give only a password (redis://:password@host:port)")
		}
		o.Password, _ = u.User.Password()
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return fail("database %q is not a number from 0", db)
		}
		o.DB = n
	}
	return o, nil
}

// Redact returns a --store setting fit for logs and errors: a URL with its password replaced
// by "xxxxx" (as url.URL.Redacted does), a file path unchanged. When an "@" does not parse as
// the end of user info (a bad URL, or a password holding "/"), everything between the first
// ":" after "://" and the last "@" is hidden instead, erring on the side of hiding.
func Redact(spec string) string {
	scheme, rest, ok := strings.Cut(spec, "://")
	if !ok {
		return spec
	}
	if u, err := url.Parse(spec); err == nil && u.User != nil {
		return u.Redacted()
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return spec
	}
	name, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return spec
	}
	return scheme + "://" + name + ":xxxxx" + rest[at:]
}
