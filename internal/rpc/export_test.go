package rpc

// StreamWorkers is how many stream workers a server keeps, for the tests that fill them.
func StreamWorkers() int { return int(streamWorkers()) }
