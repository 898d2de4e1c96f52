package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// sentHook counts the scripts a client sends: alone, and in pipelines (and those).
type sentHook struct{ alone, pipelines, piped atomic.Int64 }

func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

func (h *sentHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sentHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.alone.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *sentHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		for _, cmd := range cmds {
			if isScript(cmd) {
				h.piped.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestRedisScriptBatching: on one server, script calls made while others are being sent go
// out together as one pipeline. Each caller gets its own reply, every call is sent exactly
// once, and each caller's deadline still bounds its call.
func TestRedisScriptBatching(t *testing.T) {
	ctx := context.Background()

	t.Run("concurrent calls share pipelines and each gets its own reply", func(t *testing.T) {
		p := storetest.RedisPrefix(t)
		s := storetest.OpenRedisPrefix(t, p)
		// A script of this test's own (its text names the prefix), loaded first so that no
		// NOSCRIPT reply adds an EVAL to the count.
		incr := redis.NewScript("-- " + p + "\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])")
		if err := incr.Load(ctx, storetest.RedisClient(t)).Err(); err != nil {
			t.Fatal(err)
		}
		var h sentHook
		store.RedisClientOf(s).AddHook(&h)
		const callers, calls = 64, 25
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for g := range callers {
			wg.Go(func() {
				key := fmt.Sprintf("%sc%d", p, g)
				for i := range calls {
					// Each caller adds g+1, so a reply carried to the wrong caller shows.
					n, err := incr.Run(ctx, store.ScriptsOf(s), []string{key}, g+1).Int()
					if want := (i + 1) * (g + 1); err != nil || n != want {
						errs <- fmt.Errorf("caller %d, call %d: %d, %v; want %d", g, i, n, err, want)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if sent := h.alone.Load() + h.piped.Load(); sent != callers*calls {
			t.Errorf("%d script calls sent %d commands (%d alone, %d in %d pipelines), want each sent once", callers*calls, sent, h.alone.Load(), h.piped.Load(), h.pipelines.Load())
		}
		if h.pipelines.Load() == 0 {
			t.Errorf("%d callers at once sent every call alone: no pipeline", callers)
		}
		t.Logf("%d calls: %d alone, %d in %d pipelines", callers*calls, h.alone.Load(), h.piped.Load(), h.pipelines.Load())
	})

	t.Run("a script the server does not know falls back to EVAL in a pipeline too", func(t *testing.T) {
		p := storetest.RedisPrefix(t)
		s := storetest.OpenRedisPrefix(t, p)
		echo := redis.NewScript("-- " + p + "\nreturn ARGV[1]")
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Go(func() {
				want := fmt.Sprint("caller ", g)
				if got, err := echo.Run(ctx, store.ScriptsOf(s), nil, want).Text(); err != nil || got != want {
					t.Errorf("unloaded script, caller %d: %q, %v; want %q", g, got, err, want)
				}
			})
		}
		wg.Wait()
	})

	t.Run("a deadline bounds a queued call and a sent one", func(t *testing.T) {
		// A server of its own: this test stalls it with scripts that run for a while.
		addr := storetest.PrivateRedis(t)
		s, err := store.OpenRedis(ctx, store.RedisOptions{Addr: addr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		admin := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { admin.Close() })
		// slow holds the server for ARGV[1] ms, then counts a call on KEYS[1]; fast only counts.
		slow := redis.NewScript(`local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= ARGV[1] * 1000
return redis.call('INCR', KEYS[1])`)
		fast := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
		for _, sc := range []*redis.Script{slow, fast} {
			if err := sc.Load(ctx, admin).Err(); err != nil {
				t.Fatal(err)
			}
		}
		const hold = 250 // ms each slow script holds the server
		waitFor := func(what string, ok func(sending, queued int) bool) {
			t.Helper()
			for range 500 {
				if sending, queued, _ := store.Batching(s); ok(sending, queued) {
					return
				}
				time.Sleep(time.Millisecond)
			}
			sending, queued, _ := store.Batching(s)
			t.Fatalf("waiting for %s: %d sends under way, %d queued", what, sending, queued)
		}
		run := func(ctx context.Context, sc *redis.Script, key string, args ...any) <-chan error {
			done := make(chan error, 1)
			go func() { done <- sc.Run(ctx, store.ScriptsOf(s), []string{key}, args...).Err() }()
			return done
		}
		// a1 and a2 take both sends (the server runs a1, then a2); b, c and d queue.
		a1 := run(ctx, slow, "a1", hold)
		a2 := run(ctx, slow, "a2", hold)
		waitFor("two sends", func(sending, _ int) bool { return sending == 2 })
		b := run(ctx, slow, "b", hold)
		waitFor("b queued", func(_, queued int) bool { return queued == 1 })
		// c is sent with b when a1 ends (at 250 ms) and answered after b (at 750 ms); its
		// deadline passes in between.
		cctx, cancel := context.WithTimeout(ctx, 2*hold*time.Millisecond+hold*time.Millisecond/2)
		defer cancel()
		c := run(cctx, fast, "c")
		waitFor("c queued", func(_, queued int) bool { return queued == 2 })
		// d's deadline passes while it is queued.
		dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		if err := <-run(dctx, fast, "d"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call whose deadline passed while queued: %v, want %v", err, context.DeadlineExceeded)
		}
		if _, queued, _ := store.Batching(s); queued != 2 {
			t.Fatalf("%d calls queued after d's deadline, want 2 (b and c): d should be taken out", queued)
		}
		select {
		case err := <-c:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("call whose deadline passed after it was sent: %v, want %v", err, context.DeadlineExceeded)
			}
		case err := <-b:
			t.Fatalf("b returned (%v) before c, whose deadline passed while b ran: c waited for the pipeline", err)
		}
		for name, ch := range map[string]<-chan error{"a1": a1, "a2": a2, "b": b} {
			if err := <-ch; err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		// c was sent, so it ran, though its caller stopped waiting; d was never sent.
		for key, want := range map[string]int64{"a1": 1, "a2": 1, "b": 1, "c": 1, "d": 0} {
			n, err := admin.Exists(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n != want {
				t.Errorf("key %s: %d, want %d", key, n, want)
			}
		}
		if sending, queued, _ := store.Batching(s); sending != 0 || queued != 0 {
			t.Errorf("after every call returned: %d sends under way, %d queued; want none", sending, queued)
		}
	})
}
