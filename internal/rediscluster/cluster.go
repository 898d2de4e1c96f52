// Package rediscluster starts a real local Redis Cluster on loopback: three masters and
// three replicas, each a redis-server on a free port (and that port + 10000, its cluster
// bus), joined by `redis-cli --cluster create ... --cluster-replicas 1`. The store's tests
// (internal/store/storetest) run their contract suite on one; `handoff chaos --store
// redis-cluster` runs the platform on one and SIGKILLs a master mid-run, so its replica is
// promoted.
package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options configure Start.
type Options struct {
	// Dir holds each node's config, logs and data (required).
	Dir string
	// NodeTimeout is cluster-node-timeout: how long a master may be unreachable before its
	// replica is promoted [2s].
	NodeTimeout time.Duration
	// AppendOnly gives each node an append-only file fsynced on every write, so a node
	// restarted on its folder keeps what it acknowledged.
	AppendOnly bool
	// Server and CLI are the redis-server and redis-cli binaries [found on PATH].
	Server, CLI string
}

// Cluster is a running local cluster.
type Cluster struct {
	opts  Options
	mu    sync.Mutex
	nodes []*node
}

type node struct {
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

func (n *node) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Start starts the six nodes, creates the cluster and waits until every node agrees that all
// 16384 slots are served. On error nothing is left running.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Dir == "" {
		return nil, errors.New("rediscluster: Options.Dir is required")
	}
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = 2 * time.Second
	}
	for _, b := range []*string{&opts.Server, &opts.CLI} {
		name := map[*string]string{&opts.Server: "redis-server", &opts.CLI: "redis-cli"}[b]
		if *b == "" {
			*b = name
		}
		p, err := exec.LookPath(*b)
		if err != nil {
			return nil, err
		}
		*b = p
	}
	c = &Cluster{opts: opts}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		n := &node{port: p}
		c.nodes = append(c.nodes, n)
		if err := c.start(n); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, n := range c.nodes {
		if err := waitFor(ctx, n.addr(), func(r *redis.Client) error { return r.Ping(ctx).Err() }); err != nil {
			return nil, fmt.Errorf("redis-server %s: %w (logs in %s)", n.addr(), err, opts.Dir)
		}
	}
	args := append(append([]string{"--cluster", "create"}, c.Addrs()...), "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, opts.CLI, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitOK(ctx); err != nil {
		return nil, err
	}
	// Replication too: a replica still in its first sync acknowledges nothing (WAIT).
	for _, n := range c.nodes {
		err := waitFor(ctx, n.addr(), func(r *redis.Client) error {
			info, err := r.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(info, "role:master") && strings.Contains(info, "state=online") ||
				strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up") {
				return nil
			}
			return errors.New("replication not up yet")
		})
		if err != nil {
			return nil, fmt.Errorf("replication at %s: %w", n.addr(), err)
		}
	}
	return c, nil
}

// start launches node n's redis-server.
func (c *Cluster) start(n *node) error {
	ps := strconv.Itoa(n.port)
	args := []string{"--port", ps, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + ps + ".conf",
		"--cluster-node-timeout", strconv.FormatInt(c.opts.NodeTimeout.Milliseconds(), 10),
		"--dir", c.opts.Dir, "--save", "", "--bind", "127.0.0.1", "--daemonize", "no"}
	if c.opts.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always", "--appendfilename", "aof-"+ps+".aof", "--appenddirname", "aof-"+ps)
	} else {
		args = append(args, "--appendonly", "no")
	}
	log, err := os.OpenFile(filepath.Join(c.opts.Dir, "redis-"+ps+".log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.opts.Server, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start redis-server on port %d: %w", n.port, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(exited) }()
	c.mu.Lock()
	n.cmd, n.exited = cmd, exited
	c.mu.Unlock()
	return nil
}

// Addrs are the six nodes' addresses, for a cluster client's seed list.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.addr()
	}
	return out
}

// WaitOK waits until every running node reports cluster_state:ok with all slots served.
func (c *Cluster) WaitOK(ctx context.Context) error {
	for _, n := range c.nodes {
		c.mu.Lock()
		down := n.cmd == nil
		c.mu.Unlock()
		if down {
			continue
		}
		err := waitFor(ctx, n.addr(), func(r *redis.Client) error {
			info, err := r.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
				return errors.New("cluster_state not ok yet")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("cluster at %s: %w", n.addr(), err)
		}
	}
	return nil
}

// Masters are the addresses of the nodes that are masters now, as a live node sees it.
func (c *Cluster) Masters(ctx context.Context) ([]string, error) {
	var last error
	for _, a := range c.Addrs() {
		r := redis.NewClient(&redis.Options{Addr: a, DialTimeout: time.Second, MaxRetries: -1})
		text, err := r.ClusterNodes(ctx).Result()
		r.Close()
		if err != nil {
			last = err
			continue
		}
		var out []string
		for _, line := range strings.Split(text, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			out = append(out, strings.SplitN(f[1], "@", 2)[0])
		}
		return out, nil
	}
	return nil, fmt.Errorf("rediscluster: no node answers CLUSTER NODES: %v", last)
}

// WaitFailover waits until the live nodes list three masters, none of them the (killed)
// node at addr, and the cluster is whole again: its replica was promoted.
func (c *Cluster) WaitFailover(ctx context.Context, addr string) error {
	for {
		ms, err := c.Masters(ctx)
		if err == nil && len(ms) == 3 && !slices.Contains(ms, addr) {
			return c.WaitOK(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rediscluster: no failover of %s: %w (masters %v, %v)", addr, ctx.Err(), ms, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill SIGKILLs the node at addr and waits for it to exit.
func (c *Cluster) Kill(addr string) error {
	for _, n := range c.nodes {
		if n.addr() != addr {
			continue
		}
		c.mu.Lock()
		cmd, exited := n.cmd, n.exited
		n.cmd = nil
		c.mu.Unlock()
		if cmd == nil {
			return fmt.Errorf("rediscluster: node %s is not running", addr)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		return nil
	}
	return fmt.Errorf("rediscluster: no node %s", addr)
}

// Restart starts a killed node again on its port and folder: it rejoins the cluster (as a
// replica, when its replica was promoted meanwhile).
func (c *Cluster) Restart(addr string) error {
	for _, n := range c.nodes {
		if n.addr() == addr {
			return c.start(n)
		}
	}
	return fmt.Errorf("rediscluster: no node %s", addr)
}

// Stop kills every node. The caller removes Dir.
func (c *Cluster) Stop() {
	for _, n := range c.nodes {
		c.mu.Lock()
		cmd, exited := n.cmd, n.exited
		n.cmd = nil
		c.mu.Unlock()
		if cmd != nil {
			cmd.Process.Kill()
			<-exited
		}
	}
}

// waitFor retries check on a client of addr until it passes or ctx ends.
func waitFor(ctx context.Context, addr string, check func(*redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	for {
		err := check(c)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePorts finds n loopback ports that are free, each with its cluster bus port (+10000)
// free too. (Free when asked: another process may take one before the server binds it, in
// which case the server fails to start and the cluster is reported as not starting.)
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 200 {
			return nil, errors.New("no free loopback ports")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		if seen[p] || seen[p+10000] {
			continue
		}
		seen[p], seen[p+10000] = true, true
		ports = append(ports, p)
	}
	return ports, nil
}
