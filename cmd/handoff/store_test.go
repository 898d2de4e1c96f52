package main

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestStoreMigrate: `handoff store migrate` moves an old-layout key to its hash-tagged name
// and refuses a setting that is not one Redis.
func TestStoreMigrate(t *testing.T) {
	rdb := storetest.RedisClient(t)
	prefix := storetest.RedisPrefix(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, prefix+"request:req-1", "run-1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	spec := "redis://" + storetest.RedisAddr() + "/0?prefix=" + url.QueryEscape(prefix)
	var out, errb bytes.Buffer
	if code := run([]string{"store", "migrate", "--store", spec}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "1 keys moved") {
		t.Fatalf("store migrate = %d, %q, %q; want 0 and 1 key moved", code, out.String(), errb.String())
	}
	if v := rdb.Get(ctx, prefix+"{req-1}:request").Val(); v != "run-1" {
		t.Fatalf("migrated request record = %q, want run-1", v)
	}
	for _, bad := range []string{"handoff.db", ""} {
		errb.Reset()
		if code := run([]string{"store", "migrate", "--store", bad}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--store") {
			t.Errorf("store migrate --store %q = %d, %q; want 2 naming --store", bad, code, errb.String())
		}
	}
}
