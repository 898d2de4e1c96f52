package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
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
		r := newStalled(t, nil)
		var h sentHook
		r.client().AddHook(&h)
		echo := redis.NewScript("-- " + t.Name() + "\nreturn ARGV[1]")
		r.occupy()
		var got [4]<-chan result
		for i := range got {
			got[i] = r.call(ctx, echo, "k", fmt.Sprint("caller ", i))
			r.waitFor(fmt.Sprintf("%d queued", i+1), func(_, queued int) bool { return queued == i+1 })
		}
		for i, ch := range got {
			if r := <-ch; r.err != nil || r.val != fmt.Sprint("caller ", i) {
				t.Errorf("unloaded script, caller %d: %v, %v; want %q", i, r.val, r.err, fmt.Sprint("caller ", i))
			}
		}
		if h.pipelines.Load() == 0 {
			t.Errorf("four queued calls of an unloaded script sent no pipeline")
		}
	})

	t.Run("a deadline bounds a queued call and a sent one", func(t *testing.T) {
		r := newStalled(t, nil)
		// The times count from a1's send: the server runs a1 from then on, a2 after it. c's
		// deadline is set from there too, so a slow step of the test's own before c is made
		// (a loaded machine) cannot carry it past c's answer.
		start := time.Now()
		a1, a2 := r.occupy()
		// b and c are sent together when a1 ends (at 1 × hold), and c is answered after b
		// (at 3 × hold); c's deadline passes in between, b's long after.
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		b := r.call(bctx, slow, "b", hold.Milliseconds())
		r.waitFor("b queued", func(_, queued int) bool { return queued == 1 })
		cctx, cancel := context.WithDeadline(ctx, start.Add(5*hold/2))
		defer cancel()
		c := r.call(cctx, fast, "c")
		r.waitFor("c queued", func(_, queued int) bool { return queued == 2 })
		// d's deadline passes while it is queued.
		dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		if res := <-r.call(dctx, fast, "d"); !errors.Is(res.err, context.DeadlineExceeded) {
			t.Fatalf("call whose deadline passed while queued: %v, want %v", res.err, context.DeadlineExceeded)
		}
		if _, queued, _ := store.Batching(r.s); queued != 2 {
			t.Fatalf("%d calls queued after d's deadline, want 2 (b and c): d should be taken out", queued)
		}
		select {
		case res := <-c:
			if !errors.Is(res.err, context.DeadlineExceeded) {
				t.Fatalf("call whose deadline passed after it was sent: %v, want %v", res.err, context.DeadlineExceeded)
			}
		case res := <-b:
			t.Fatalf("b returned (%v) before c, whose deadline passed while b ran: c waited for the pipeline", res.err)
		}
		select {
		case res := <-a1:
			if res.err != nil {
				t.Errorf("a1: %v", res.err)
			}
		default:
			t.Errorf("a1 had not returned when c's deadline passed: its caller sent the queued calls' pipeline before returning")
		}
		for name, ch := range map[string]<-chan result{"a2": a2, "b": b} {
			if res := <-ch; res.err != nil {
				t.Errorf("%s: %v (a pipeline must carry the latest deadline of its calls)", name, res.err)
			}
		}
		// c was written, so it ran, though its caller stopped waiting; d was never sent.
		r.wantCounts(map[string]int{"a1": 1, "a2": 1, "b": 1, "c": 1, "d": 0})
	})

	t.Run("a call whose caller stopped waiting before it was written does not run", func(t *testing.T) {
		// The pipeline's connection takes a while to dial (a new connection, after a
		// restart, say); the caller's deadline passes meanwhile.
		slowDial := atomic.Bool{}
		r := newStalled(t, func(ctx context.Context, network, addr string) (net.Conn, error) {
			if slowDial.Load() {
				select {
				case <-time.After(3 * hold):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		})
		r.warm(2)
		slowDial.Store(true)
		a1, a2 := r.occupy()
		cctx, cancel := context.WithTimeout(ctx, 3*hold/2)
		defer cancel()
		c := r.call(cctx, fast, "c")
		r.waitFor("c queued", func(_, queued int) bool { return queued == 1 })
		e := r.call(ctx, fast, "e") // no deadline: the pipeline waits for its connection
		r.waitFor("e queued", func(_, queued int) bool { return queued == 2 })
		if res := <-c; !errors.Is(res.err, context.DeadlineExceeded) {
			t.Fatalf("c: %v, want %v", res.err, context.DeadlineExceeded)
		}
		for name, ch := range map[string]<-chan result{"a1": a1, "a2": a2, "e": e} {
			if res := <-ch; res.err != nil {
				t.Errorf("%s: %v", name, res.err)
			}
		}
		r.wantCounts(map[string]int{"c": 0, "e": 1})
	})

	t.Run("a panicking hook fails the calls it was sending, not the batcher", func(t *testing.T) {
		r := newStalled(t, nil)
		boom := panicHook{}
		r.client().AddHook(boom)
		// Alone: the panic reaches its caller, and the send is still counted as ended.
		for range 3 {
			func() {
				defer func() { recover() }()
				// A send left counted would queue the third call: its deadline ends the wait.
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				fast.Run(ctx, store.ScriptsOf(r.s), []string{"boom"})
			}()
		}
		if sending, _, _ := store.Batching(r.s); sending != 0 {
			t.Fatalf("%d sends under way after three panicking calls returned, want 0", sending)
		}
		// In a pipeline: every call of it fails, and the process lives on.
		r.occupy()
		var calls [3]<-chan result
		for i := range calls {
			calls[i] = r.call(ctx, fast, "boom")
			r.waitFor(fmt.Sprintf("%d queued", i+1), func(_, queued int) bool { return queued == i+1 })
		}
		for i, ch := range calls {
			if res := <-ch; res.err == nil || !strings.Contains(res.err.Error(), "panic") {
				t.Errorf("call %d of a pipeline whose hook panicked: %v, want an error naming the panic", i, res.err)
			}
		}
		if res := <-r.call(ctx, fast, "after"); res.err != nil {
			t.Errorf("a call after the panics: %v", res.err)
		}
		r.waitFor("every send ended", func(sending, queued int) bool { return sending == 0 && queued == 0 })
	})

	t.Run("closing the store fails the queued calls", func(t *testing.T) {
		r := newStalled(t, nil)
		r.occupy()
		var calls [3]<-chan result
		for i := range calls {
			calls[i] = r.call(ctx, fast, fmt.Sprint("q", i))
			r.waitFor(fmt.Sprintf("%d queued", i+1), func(_, queued int) bool { return queued == i+1 })
		}
		r.s.Close()
		for i, ch := range calls {
			if res := <-ch; !errors.Is(res.err, redis.ErrClosed) {
				t.Errorf("queued call %d after Close: %v, want %v", i, res.err, redis.ErrClosed)
			}
		}
		r.waitFor("every send ended", func(sending, queued int) bool { return sending == 0 && queued == 0 })
	})

	t.Run("a shared client with retries is not batched", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: storetest.RedisAddr()})
		t.Cleanup(func() { c.Close() })
		s, err := store.OpenRedis(ctx, store.RedisOptions{Client: c, Prefix: storetest.RedisPrefix(t)})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, batched := store.Batching(s); batched {
			t.Fatalf("a client that retries is batched: a retried pipeline would run its calls again")
		}
	})
}

// hold is how long a slow script holds the server.
const hold = 250 * time.Millisecond

var (
	// slow holds the server for ARGV[1] ms, then counts a call on KEYS[1]; fast only counts.
	slow = redis.NewScript(`local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= ARGV[1] * 1000
return redis.call('INCR', KEYS[1])`)
	fast = redis.NewScript(`return redis.call('INCR', KEYS[1])`)
)

// stalled is a store on a server of the test's own, which the test stalls with slow
// scripts to fill the batcher's sends and queue.
type stalled struct {
	t     *testing.T
	s     *store.Redis
	admin *redis.Client
}

type result struct {
	val any
	err error
}

// newStalled starts the server and opens a store on it: with dial, on a client of the
// test's own (retries off) that dials with it.
func newStalled(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *stalled {
	t.Helper()
	ctx := context.Background()
	addr := storetest.PrivateRedis(t)
	o := store.RedisOptions{Addr: addr}
	if dial != nil {
		o.Client = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, Dialer: dial})
		t.Cleanup(func() { o.Client.Close() })
	}
	s, err := store.OpenRedis(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	admin := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { admin.Close() })
	for _, sc := range []*redis.Script{slow, fast} {
		if err := sc.Load(ctx, admin).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return &stalled{t: t, s: s, admin: admin}
}

func (r *stalled) client() *redis.Client { return store.RedisClientOf(r.s).(*redis.Client) }

// call runs sc through the store's batcher in a goroutine of its own.
func (r *stalled) call(ctx context.Context, sc *redis.Script, key string, args ...any) <-chan result {
	done := make(chan result, 1)
	go func() {
		v, err := sc.Run(ctx, store.ScriptsOf(r.s), []string{key}, args...).Result()
		done <- result{v, err}
	}()
	return done
}

// warm leaves n connections in the client's pool, so that later calls alone need no dial:
// all n are held at once, so none is reused for another.
func (r *stalled) warm(n int) {
	r.t.Helper()
	conns := make([]*redis.Conn, n)
	for i := range conns {
		conns[i] = r.client().Conn()
		if err := conns[i].Ping(context.Background()).Err(); err != nil {
			r.t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Close() // back to the pool
	}
}

// occupy takes both sends with slow scripts on keys a1 and a2; the server runs a1, then a2.
func (r *stalled) occupy() (a1, a2 <-chan result) {
	r.t.Helper()
	a1 = r.call(context.Background(), slow, "a1", hold.Milliseconds())
	r.waitFor("a1 sent", func(sending, _ int) bool { return sending == 1 })
	a2 = r.call(context.Background(), slow, "a2", hold.Milliseconds())
	r.waitFor("a2 sent", func(sending, _ int) bool { return sending == 2 })
	return a1, a2
}

func (r *stalled) waitFor(what string, ok func(sending, queued int) bool) {
	r.t.Helper()
	for range 2000 {
		if sending, queued, _ := store.Batching(r.s); ok(sending, queued) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	sending, queued, _ := store.Batching(r.s)
	r.t.Fatalf("waiting for %s: %d sends under way, %d queued", what, sending, queued)
}

// wantCounts checks how many times each key's script ran.
func (r *stalled) wantCounts(want map[string]int) {
	r.t.Helper()
	for key, n := range want {
		got, err := r.admin.Get(context.Background(), key).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			r.t.Fatal(err)
		}
		if got != n {
			r.t.Errorf("key %s: ran %d times, want %d", key, got, n)
		}
	}
}

// panicHook panics on every script for the key "boom".
type panicHook struct{}

func (panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) && slices.Contains(cmd.Args(), any("boom")) {
			panic("hook")
		}
		return next(ctx, cmd)
	}
}

func (panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd) && slices.Contains(cmd.Args(), any("boom")) {
				panic("hook")
			}
		}
		return next(ctx, cmds)
	}
}
