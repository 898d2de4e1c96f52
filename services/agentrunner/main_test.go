package agentrunner_test

import (
	"os"
	"testing"

	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestMain stops the local Redis Cluster that tests on it start (storetest.ClusterAddrs).
func TestMain(m *testing.M) {
	code := m.Run()
	storetest.StopCluster()
	os.Exit(code)
}
