package store

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every bbolt write transaction ends in an fsync, and bbolt runs one at a
// time, so under concurrency writers queue behind each other's fsyncs: a hop's few writes
// made the embedded store the slowest part of the platform. update lets the writers that
// queue up while one transaction commits share the next one: each call's function runs in
// that transaction, and each caller returns only after it is durable, as with db.Update.
//
// Unlike bbolt's own Batch there is no timer: a writer that finds nobody committing starts
// at once, so a lone call costs what db.Update costs, and batches form only from writers
// that would have waited anyway. The one exception is a write its caller marked with
// Linger (one off the caller's critical path, such as the package-sent event written while
// the package travels, or a completion stored after its result was sent): finding nobody
// committing, it waits up to its linger for another writer to lead a transaction it can
// join, and commits alone only if none comes. On one host the writes of a hop then share
// fsyncs: the package-sent event with the runner's Admit, the runner's Complete with the
// coordinator's save.
//
// The leader is the caller that found nobody committing. It commits everything queued (its
// own call among it), wakes those callers with their results, and passes the lead to the
// first caller that queued meanwhile, so no caller commits other people's work for long.

var errClosed = errors.New("store: closed")

// txCall is one caller's function and its outcome.
type txCall struct {
	fn   func(*bolt.Tx) error
	err  error
	done bool      // err is the call's outcome
	wake chan bool // true: lead the next commit; false: done, err is set
}

// committer is the queue update uses.
type committer struct {
	mu         sync.Mutex
	idle       *sync.Cond // signalled when committing ends
	queue      []*txCall
	committing bool
	closed     bool
	txs        atomic.Int64 // write transactions begun (committed or rolled back), for tests
}

// update runs fn in a write transaction, shared with concurrent callers (see above). fn
// may run more than once (after a rolled-back attempt), so it must set all its outputs on
// every run and have no effect outside tx. Its error, or the commit's, is returned.
func (s *Bolt) update(fn func(*bolt.Tx) error) error { return s.updateLinger(0, fn) }

// updateLinger is update for a write that may wait up to linger for company (see above)
// before it commits alone; linger <= 0 is update.
func (s *Bolt) updateLinger(linger time.Duration, fn func(*bolt.Tx) error) error {
	c := &txCall{fn: fn, wake: make(chan bool, 1)}
	g := &s.commit
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return errClosed
	}
	g.queue = append(g.queue, c)
	lead := !g.committing
	if lead && linger > 0 {
		// Queued with nobody committing: the next writer to come leads and takes this call
		// along. If none comes in time, this call leads, unless a commit has started
		// meanwhile (then it is in that batch or the next, like any queued call).
		lead = false
		time.AfterFunc(linger, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if !g.committing && slices.Contains(g.queue, c) {
				g.committing = true
				c.wake <- true
			}
		})
	} else {
		g.committing = true
	}
	g.mu.Unlock()
	if !lead && !<-c.wake {
		return c.err
	}

	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	s.commitBatch(batch)
	for _, o := range batch {
		if o != c {
			o.wake <- false
		}
	}
	g.mu.Lock()
	if len(g.queue) > 0 {
		g.queue[0].wake <- true
	} else {
		g.committing = false
		g.idle.Broadcast()
	}
	g.mu.Unlock()
	return c.err
}

// commitBatch runs the batch's functions in one transaction and sets every call's err. When
// one function fails, the transaction is rolled back, that call runs alone (its own
// transaction gives its own answer), and the rest are committed again without it: each
// call's outcome is then that of some serial order of the calls, as with one transaction
// each.
func (s *Bolt) commitBatch(batch []*txCall) {
	all := batch
	defer func() {
		// A panic outside the callers' functions (in bbolt itself) must not leave the
		// others waiting forever: each undecided call gets it as its error, and the lead
		// is passed on as usual.
		if r := recover(); r != nil {
			for _, c := range all {
				if !c.done {
					c.err, c.done = fmt.Errorf("store: write transaction failed: %v", r), true
				}
			}
		}
	}()
	set := func(c *txCall, err error) { c.err, c.done = err, true }
	for len(batch) > 0 {
		s.commit.txs.Add(1)
		if len(batch) == 1 {
			set(batch[0], s.db.Update(batch[0].run))
			return
		}
		failed := -1
		err := s.db.Update(func(tx *bolt.Tx) error {
			for i, c := range batch {
				if err := c.run(tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 { // committed, or the commit itself failed: the same for everyone
			for _, c := range batch {
				set(c, err)
			}
			return
		}
		c := batch[failed]
		s.commit.txs.Add(1)
		set(c, s.db.Update(c.run))
		batch = slices.Delete(slices.Clone(batch), failed, failed+1)
	}
}

// run calls fn, turning a panic into its error: the leader runs other callers' functions,
// and one caller's panic must not take the others' transaction (or the process) with it.
func (c *txCall) run(tx *bolt.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("store: panic in a write transaction: %v", r)
		}
	}()
	return c.fn(tx)
}

// closeCommits refuses new writes, commits the lingering ones at once, and waits for the
// running commit to finish.
func (s *Bolt) closeCommits() {
	g := &s.commit
	g.mu.Lock()
	g.closed = true
	if !g.committing && len(g.queue) > 0 {
		g.committing = true
		g.queue[0].wake <- true
	}
	for g.committing {
		g.idle.Wait()
	}
	g.mu.Unlock()
}
