package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
//   - redis-cluster://[:password@]host:port,host:port,...[?prefix=P&wait=N] is Redis Cluster
//     (go-redis ClusterClient): some of its nodes, from which the client learns the rest.
//     Each is host:port; there is no database (a cluster has only 0); password and prefix
//     are as for redis://; wait=N (0 to 5, default 0) makes each claim, receipt and ledger
//     write wait for N replicas (RedisOptions.WaitReplicas).
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
	// A deployment upgraded without migrating would see none of its data: refuse it.
	if old, err := st.oldLayout(ctx); err != nil || old {
		st.Close()
		if err == nil {
			err = ErrOldLayout
		}
		return nil, fmt.Errorf("%q: %w", Redact(spec), err)
	}
	return st, nil
}

// OpenURLWait is OpenURL for a service that is starting: while a Redis store does not answer
// (refused, reset, timed out: it may be starting or restarting with the rest of the
// deployment), it tries again, pausing 200 ms doubling up to 5 s, until wait has passed since
// the first attempt or ctx ends; then the last error is returned. retrying, when set, is
// told each failure and the pause before the next attempt (for the log). A setting that
// cannot work fails at once: a bad URL, a Redis that answers with an error (a wrong
// password, a missing database), a bbolt file. wait <= 0 is OpenURL.
func OpenURLWait(ctx context.Context, spec string, wait time.Duration, retrying func(err error, pause time.Duration)) (Store, error) {
	deadline := time.Now().Add(wait)
	pause := 200 * time.Millisecond
	for {
		st, err := OpenURL(ctx, spec)
		if err == nil || wait <= 0 || !unreachable(err) || ctx.Err() != nil {
			return st, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w (still unreachable after waiting %s)", err, wait)
		}
		pause = min(pause, left)
		if retrying != nil {
			retrying(err, pause)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (gave up waiting: %w)", err, ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// LogRetries is an OpenURLWait retrying function that logs each failed attempt as a warning.
func LogRetries(log *slog.Logger, spec string) func(err error, pause time.Duration) {
	return func(err error, pause time.Duration) {
		log.Warn("store not reachable yet; trying again", "store", Redact(spec), "in", pause.String(), "err", err)
	}
}

// unreachable reports whether err says the store could not be reached, as opposed to a
// store that answered with a refusal or a setting that is wrong.
func unreachable(err error) bool {
	var ne net.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &oe), errors.As(err, &ne):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	// A Redis that is loading its data set answers LOADING until it is ready.
	return strings.Contains(err.Error(), "LOADING")
}

// ParseURL checks a --store setting (see OpenURL) without opening anything: for a redis://
// URL it returns the options OpenURL connects with (Prefix always set), for a bbolt file path
// nil. Errors name the setting with its password redacted.
func ParseURL(spec string) (*RedisOptions, error) {
	if spec == "" {
		return nil, errors.New("no store given: want a bbolt file path, redis://[:password@]host:port[/db] or redis-cluster://host:port,host:port")
	}
	if !strings.Contains(spec, "://") {
		return nil, nil
	}
	shown := Redact(spec)
	fail := func(format string, args ...any) (*RedisOptions, error) {
		return nil, fmt.Errorf("%q: "+format, append([]any{shown}, args...)...)
	}
	if rest, ok := strings.CutPrefix(spec, "redis-cluster://"); ok {
		return parseClusterURL(rest, fail)
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
		return fail("only redis://[:password@]host:port[/db] and redis-cluster://host:port,... URLs are supported (or give a bbolt file path)")
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
	if o.Prefix, err = prefixParam(q); err != nil {
		return fail("%v", err)
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

// prefixParam reads the query of a store URL: only prefix, one non-empty value, default
// "handoff:".
func prefixParam(q url.Values) (string, error) {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k != "prefix" {
			return "", fmt.Errorf("query parameter %q is not supported (only prefix)", k)
		}
	}
	v, ok := q["prefix"]
	if !ok {
		return defaultRedisPrefix, nil
	}
	if len(v) != 1 || v[0] == "" {
		return "", errors.New("prefix wants one non-empty value")
	}
	return v[0], nil
}

// parseClusterURL reads what follows "redis-cluster://": [:password@]host:port,...[?query].
// (net/url takes one host only, so the node list is split here.)
func parseClusterURL(rest string, fail func(string, ...any) (*RedisOptions, error)) (*RedisOptions, error) {
	const want = "want redis-cluster://[:password@]host:port,host:port,...[?prefix=P&wait=N]"
	if strings.Contains(rest, "#") {
		return fail("a fragment is not supported")
	}
	rest, query, _ := strings.Cut(rest, "?")
	o := &RedisOptions{}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		name, pw, _ := strings.Cut(rest[:at], ":")
		if name != "" && name != "default" {
			return fail("a user name is not supported; give only a password (redis-cluster://:password@host:port,...)")
		}
		p, err := url.PathUnescape(pw)
		if err != nil {
			return fail("password: %v", err)
		}
		o.Password, rest = p, rest[at+1:]
	}
	if strings.Contains(rest, "/") {
		return fail("a path or database is not supported (a cluster has only database 0); %s", want)
	}
	for _, a := range strings.Split(rest, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return fail("node %q: %s", a, want)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fail("node %q: port %q is not a number from 1 to 65535", a, port)
		}
		o.Cluster = append(o.Cluster, a)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return fail("query: %v", err)
	}
	wait := q["wait"]
	q.Del("wait")
	if o.Prefix, err = prefixParam(q); err != nil {
		return fail("%v", err)
	}
	if wait != nil {
		n, err := strconv.Atoi(wait[0])
		if len(wait) != 1 || err != nil || n < 0 || n > 5 {
			return fail("wait wants one number of replicas from 0 to 5, got %q", strings.Join(wait, ","))
		}
		o.WaitReplicas = n
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
