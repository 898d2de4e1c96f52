package store_test

import (
	"testing"

	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestRedisLeasesAcrossClients: the lease contract on two stores with their own connections
// under one prefix, as two coordinator processes have them.
func TestRedisLeasesAcrossClients(t *testing.T) {
	prefix := storetest.RedisPrefix(t)
	storetest.RunLeases(t, storetest.OpenRedisPrefix(t, prefix), storetest.OpenRedisPrefix(t, prefix))
}
