package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script calls on one Redis share pipelines. A five-stage job makes 18 script calls; under
// load each was its own write on its own pooled connection, its own read, and its own
// wake-up of Redis's event loop. Most of a script call's CPU, on both sides, is that
// per-call I/O rather than the script (bench/README.md, eleventh round).
//
// scriptBatcher sends the script calls that arrive while earlier ones are being sent as one
// pipeline: one write and one read for the lot. As with the bbolt group commit there is no
// timer: a call that finds fewer than maxSending sends under way is sent at once, alone, as
// it would be without the batcher, so a lone caller pays nothing. Calls that queue meanwhile
// go out together as soon as a send finishes, from a goroutine of the batcher.
//
// The rules of a call stay as they were:
//   - Its caller's deadline bounds it, and so does its cancellation once it is queued. A
//     call whose caller stops waiting before its pipeline writes it is never run: it is
//     taken out of the queue, or, already taken into a pipeline still waiting for its
//     connection, written as a PING instead (one reply per command keeps the replies in
//     step). One whose caller stops waiting after it was written may have run; the caller
//     gets the context's error at once, as from a command whose deadline passes mid-read.
//     A call sent alone is go-redis's own: its deadline bounds it, a cancellation without
//     one does not interrupt the read. A pipeline carries the latest deadline of its calls,
//     so no call's deadline cuts another's short, and it is abandoned (its connection wait
//     and dial cancelled) once every one of its callers has stopped waiting.
//   - Nothing is sent twice: the batcher is used only when the client's retries are off.
//   - Each call gets its own reply or error (NOSCRIPT included, so Script.Run falls back to
//     EVAL as before); a broken connection fails every call of its pipeline, as it fails
//     every command written on it. A panic in a hook fails the calls it was sending.
//   - Redis runs each script atomically, and the calls of one caller in order, since a
//     caller waits for each reply before its next call.
//   - A caller must not change the keys or arguments it passed until its call returns, and
//     after an error not before its context is done: a queued call is written later.
//
// Only scripts are batched: they are all of a job's hot path. WAIT (RedisOptions.WaitReplicas)
// needs the writes on its own connection, so replicated writes bypass the batcher.
type scriptBatcher struct {
	*redis.Client // every other command goes straight to the client

	mu      sync.Mutex
	sending int // sends under way: a lone call's, or a goroutine's pipelines
	queue   []*scriptCall
}

// maxSending is how many sends may be under way at once: with two, Redis can run one batch
// while the client reads the replies of the other and writes the next. One, two and four
// measured alike, within the VM's drift, at 32 jobs in flight (bench/README.md).
const maxSending = 2

func newScriptBatcher(c *redis.Client) *scriptBatcher { return &scriptBatcher{Client: c} }

// scriptCall is one queued EVAL or EVALSHA and, once done is closed, its reply.
type scriptCall struct {
	ctx    context.Context
	eval   bool   // EVAL with the script's source, else EVALSHA with its hash
	script string // source or hash
	keys   []string
	args   []any

	cmd  *redis.Cmd
	done chan struct{}
}

func (c *scriptCall) on(ctx context.Context, s redis.Scripter) *redis.Cmd {
	if c.eval {
		return s.Eval(ctx, c.script, c.keys, c.args...)
	}
	return s.EvalSha(ctx, c.script, c.keys, c.args...)
}

// failed is the call's command with err as its outcome: what a caller gets that stopped
// waiting, or whose call was never sent.
func (c *scriptCall) failed(err error) *redis.Cmd {
	cmd := redis.NewCmd(c.ctx)
	cmd.SetErr(err)
	return cmd
}

func (b *scriptBatcher) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return b.do(&scriptCall{ctx: ctx, script: sha1, keys: keys, args: args})
}

func (b *scriptBatcher) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.do(&scriptCall{ctx: ctx, eval: true, script: script, keys: keys, args: args})
}

func (b *scriptBatcher) do(c *scriptCall) *redis.Cmd {
	if err := c.ctx.Err(); err != nil {
		return c.failed(err)
	}
	b.mu.Lock()
	if b.sending < maxSending {
		b.sending++
		b.mu.Unlock()
		defer b.sent()
		return c.on(c.ctx, b.Client)
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd
	case <-c.ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
		// Taken out, it is never sent. Taken into a pipeline, it is written as a PING if
		// not written yet (unlessGone), and otherwise its reply is dropped.
		return c.failed(c.ctx.Err())
	}
}

// sent ends a send: the calls queued meanwhile go out from a goroutine, so the caller whose
// send ended returns now rather than after theirs.
func (b *scriptBatcher) sent() {
	if batch := b.next(); len(batch) > 0 {
		go b.flush(batch)
	}
}

// flush sends batch, then whatever queued while it was sent, until the queue is empty.
func (b *scriptBatcher) flush(batch []*scriptCall) {
	for ; len(batch) > 0; batch = b.next() {
		b.send(batch)
	}
}

// next takes the queue for the send that just ended to go on with; an empty queue ends
// that send.
func (b *scriptBatcher) next() []*scriptCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := b.queue
	b.queue = nil
	if len(batch) == 0 {
		b.sending--
	}
	return batch
}

// send runs the calls of batch whose callers still wait, as one pipeline, and wakes them.
func (b *scriptBatcher) send(batch []*scriptCall) {
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.cmd = c.failed(err)
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	defer func() {
		p := recover() // from a hook: it fails these calls, not the process
		for _, c := range live {
			if p != nil {
				c.cmd = c.failed(fmt.Errorf("store: script pipeline: panic: %v", p))
			}
			close(c.done)
		}
	}()
	if len(live) == 1 {
		c := live[0]
		c.cmd = c.on(c.ctx, b.Client)
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()
	// The commands are made by one pipeline and written by another, each behind its
	// caller's context (unlessGone).
	made, pipe := b.Client.Pipeline(), b.Client.Pipeline()
	for _, c := range live {
		c.cmd = c.on(c.ctx, made)
		_ = pipe.Process(ctx, unlessGone{c.cmd, c.ctx})
	}
	// Each call's error is on its own command; Exec's is only the first of them.
	_, _ = pipe.Exec(ctx)
}

// unlessGone is a call's command as its pipeline writes it: go-redis takes a command's
// arguments when it writes it, after the connection is ready, so a call whose caller has
// stopped waiting by then is written as a PING.
type unlessGone struct {
	*redis.Cmd
	ctx context.Context
}

func (g unlessGone) Args() []any {
	if g.ctx.Err() != nil {
		return []any{"ping"}
	}
	return g.Cmd.Args()
}

// batchContext bounds a pipeline by the latest deadline among its calls' (none if one of
// them has none: the client's read and write timeouts still apply). It is not cancelled
// with any one call, only once all of them are.
func batchContext(calls []*scriptCall) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			last = time.Time{}
			break
		}
		if d.After(last) {
			last = d
		}
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if last.IsZero() {
		ctx, cancel = context.WithCancel(context.Background())
	} else {
		ctx, cancel = context.WithDeadline(context.Background(), last)
	}
	waiting := atomic.Int32{}
	waiting.Store(int32(len(calls)))
	stops := make([]func() bool, len(calls))
	for i, c := range calls {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
