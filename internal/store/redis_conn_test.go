package store_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestRedisPeeksOnlyQuietConnections: the store's client (retries off) checks a pooled
// connection before a command only when it has heard nothing on it for HeardWithin. A
// connection the server closed while quiet longer than that is replaced before the command,
// which then succeeds; one closed right after a reply is used, and that command fails (the
// trade the policy makes), and the next runs on a new connection.
func TestRedisPeeksOnlyQuietConnections(t *testing.T) {
	s := storetest.OpenRedis(t)
	c, ok := store.RedisClientOf(s).(*redis.Client)
	if !ok {
		t.Fatalf("store client is %T, want *redis.Client", store.RedisClientOf(s))
	}
	admin := storetest.RedisClient(t)
	ctx := context.Background()
	// kill closes, from the server's side, the connection the store's next command takes
	// (the pool hands out the one it just got back), and returns its id and when it last
	// read a reply.
	kill := func() (int64, time.Time) {
		t.Helper()
		id, err := c.ClientID(ctx).Result()
		heard := time.Now()
		if err != nil {
			t.Fatalf("CLIENT ID: %v", err)
		}
		if n, err := admin.ClientKillByFilter(ctx, "ID", itoa(id)).Result(); err != nil || n != 1 {
			t.Fatalf("CLIENT KILL ID %d: %d killed, %v", id, n, err)
		}
		return id, heard
	}

	t.Run("closed while quiet: replaced before the command", func(t *testing.T) {
		old, _ := kill()
		time.Sleep(store.HeardWithin + 100*time.Millisecond)
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping after the server closed a connection quiet for %s: %v (want a new connection)", store.HeardWithin, err)
		}
		if id := c.ClientID(ctx).Val(); id == old {
			t.Fatalf("the command ran on the killed connection %d", old)
		}
	})
	t.Run("closed right after a reply: that command fails, the next does not", func(t *testing.T) {
		// On a loaded machine the kill may take longer than the window; such a try says
		// nothing, and is made again.
		for try := 0; ; try++ {
			old, heard := kill()
			if time.Since(heard) >= store.HeardWithin {
				if try == 9 {
					t.Fatalf("ten tries, each slower than %s between a reply and the next command", store.HeardWithin)
				}
				if err := s.Ping(ctx); err != nil { // drop the killed connection, whatever the policy did
					t.Logf("try %d was late; its Ping: %v", try, err)
				}
				continue
			}
			if err := s.Ping(ctx); err == nil {
				t.Fatal("Ping on a connection closed just after its last reply succeeded: it was checked, so every command pays the peek")
			}
			if err := s.Ping(ctx); err != nil {
				t.Fatalf("second Ping: %v", err)
			}
			if id := c.ClientID(ctx).Val(); id == old {
				t.Fatalf("the command ran on the killed connection %d", old)
			}
			return
		}
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
