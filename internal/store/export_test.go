package store

import "github.com/redis/go-redis/v9"

// HeardWithin is heardWithin, for the tests of the connection policy (redis_conn.go).
const HeardWithin = heardWithin

// RedisClientOf is the client a Redis store dialled.
func RedisClientOf(s *Redis) redis.UniversalClient { return s.rdb }
