package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The replication probe measures Redis's asynchronous-replication hole itself: up to the
// instant a master is SIGKILLed, a writer on that master SETs keys one after the other, each
// acknowledged (and, with Config.Wait, each followed by WAIT 1 on the same connection, as
// the store does), and after the failover the harness counts the acknowledged keys the
// promoted replica does not have. Those are writes a caller was told of that the cluster
// lost: what an idempotency claim, receipt or ledger entry would suffer at that moment.

// ProbeReport counts the probe's acknowledged writes and those lost across all master kills.
type ProbeReport struct {
	Acknowledged int `json:"acknowledged"`
	Lost         int `json:"lost"`
}

type probe struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	acked []string
}

// startProbe writes to master addr until stopped. Its keys all live in slots of that master
// (hash tags chosen by asking the cluster), so the kill takes them all.
func startProbe(ctx context.Context, rdb *redis.ClusterClient, addr string, wait bool, round int) (*probe, error) {
	var tag string
	for i := 0; i < 10000 && tag == ""; i++ {
		t := fmt.Sprintf("{probe-%d-%d}", round, i)
		m, err := rdb.MasterForKey(ctx, t)
		if err != nil {
			return nil, err
		}
		if m.Options().Addr == addr {
			tag = t
		}
	}
	if tag == "" {
		return nil, fmt.Errorf("no hash tag on master %s", addr)
	}
	m, err := rdb.MasterForKey(ctx, tag)
	if err != nil {
		return nil, err
	}
	p := &probe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		conn := m.Conn()
		defer conn.Close()
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			k := fmt.Sprintf("%s:%d", tag, i)
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := conn.Set(wctx, k, "1", 0).Err()
			if err == nil && wait {
				var n int64
				n, err = conn.Wait(wctx, 1, time.Second).Result()
				if err == nil && n < 1 {
					err = fmt.Errorf("not replicated")
				}
			}
			cancel()
			if err != nil {
				return // the master is gone: nothing more is acknowledged
			}
			p.mu.Lock()
			p.acked = append(p.acked, k)
			p.mu.Unlock()
		}
	}()
	return p, nil
}

// end stops the writer (the master is dead by now) and returns the acknowledged keys.
func (p *probe) end() []string {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acked
}

// lost counts the keys the cluster no longer has (after the failover).
func countLost(ctx context.Context, rdb *redis.ClusterClient, keys []string) (int, error) {
	lost := 0
	for i := 0; i < len(keys); i += 500 {
		pipe := rdb.Pipeline()
		var cmds []*redis.IntCmd
		for _, k := range keys[i:min(i+500, len(keys))] {
			cmds = append(cmds, pipe.Exists(ctx, k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, err
		}
		for _, c := range cmds {
			if c.Val() == 0 {
				lost++
			}
		}
	}
	return lost, nil
}
