package store

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OpenURL opens the store a --store setting names: "redis://[:password@]host:port[/db]"
// for Redis (what several processes share), anything else a bbolt file path (one process).
func OpenURL(ctx context.Context, spec string) (Store, error) {
	if !strings.HasPrefix(spec, "redis://") {
		if err := os.MkdirAll(filepath.Dir(spec), 0o755); err != nil {
			return nil, fmt.Errorf("store %s: %w", spec, err)
		}
		return Open(spec)
	}
	u, err := url.Parse(spec)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("store %q: want redis://host:port[/db]", spec)
	}
	o := RedisOptions{Addr: u.Host}
	if pw, ok := u.User.Password(); ok {
		o.Password = pw
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		if o.DB, err = strconv.Atoi(db); err != nil {
			return nil, fmt.Errorf("store %q: database %q is not a number", spec, db)
		}
	}
	if p := u.Query().Get("prefix"); p != "" {
		o.Prefix = p
	}
	return OpenRedis(ctx, o)
}
