package store

import "github.com/redis/go-redis/v9"

// HeardWithin is heardWithin, for the tests of the connection policy (redis_conn.go).
const HeardWithin = heardWithin

// RedisClientOf is the client a Redis store dialled.
func RedisClientOf(s *Redis) redis.UniversalClient { return s.rdb }

// ScriptsOf is what the store sends its scripts through: on one server, its scriptBatcher.
func ScriptsOf(s *Redis) redis.Scripter { return s.run }

// Batching reports a Redis store's script batcher: the sends under way and the calls
// queued; ok is false when the store has none (a cluster).
func Batching(s *Redis) (sending, queued int, ok bool) {
	b, ok := s.run.(*scriptBatcher)
	if !ok {
		return 0, 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sending, len(b.queue), true
}
