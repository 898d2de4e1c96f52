package coordinator_test

import (
	"testing"

	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestMain stops the local Redis Cluster that tests on it start (storetest.ClusterAddrs).
func TestMain(m *testing.M) { storetest.Main(m) }
