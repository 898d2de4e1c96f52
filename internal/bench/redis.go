package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisAddr is where the figures that need Redis look for it.
const DefaultRedisAddr = "127.0.0.1:6379"

// newRedis dials addr with the settings store.OpenRedis uses (short timeouts, retries off)
// and checks it answers a PING.
func newRedis(ctx context.Context, addr string) (*redis.Client, error) {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           3 * time.Second,
		WriteTimeout:          3 * time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
	})
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	return rdb, nil
}

// RedisReachable reports why Redis at addr cannot be used (nil when it answers a PING).
func RedisReachable(ctx context.Context, addr string) error {
	rdb, err := newRedis(ctx, addr)
	if err != nil {
		return err
	}
	return rdb.Close()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newPrefix is a key prefix no other run uses: "handoff-bench:<what>:<random>:".
func newPrefix(what string) string { return "handoff-bench:" + what + ":" + randomHex(6) + ":" }

// deletePrefix removes every key under prefix and returns how many it removed.
func deletePrefix(ctx context.Context, addr, prefix string) (int, error) {
	rdb, err := newRedis(ctx, addr)
	if err != nil {
		return 0, err
	}
	defer rdb.Close()
	n, cursor := 0, uint64(0)
	for {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return n, err
		}
		if len(keys) > 0 {
			if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
				return n, err
			}
			n += len(keys)
		}
		if cursor = next; cursor == 0 {
			return n, nil
		}
	}
}
