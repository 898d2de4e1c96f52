package crashpoint

import (
	"sync"
	"testing"
)

// TestHit: a build with crash points reports each Hit to the hook and waits for it; a
// normal build never calls it, whatever the environment says.
func TestHit(t *testing.T) {
	var mu sync.Mutex
	var got []Visit
	url, stop, err := Serve(func(v Visit) {
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	t.Setenv(HookEnv, url)
	Hit(AfterClaim, "job:writeback:summary_md")
	mu.Lock()
	defer mu.Unlock()
	if !Enabled {
		if len(got) != 0 {
			t.Fatalf("a build without -tags crashpoints called the hook: %+v", got)
		}
		return
	}
	if len(got) != 1 || got[0].Point != AfterClaim || got[0].Key != "job:writeback:summary_md" || got[0].PID == 0 {
		t.Fatalf("hook got %+v; want one visit of %s", got, AfterClaim)
	}
}
