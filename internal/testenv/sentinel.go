package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name the sentinels of StartSentinel monitor.
const SentinelMaster = "mymaster"

// Sentinel is a Redis deployment of the test's own: a master, a replica and
// three sentinels (quorum 2), each a redis-server process on a free port of
// 127.0.0.1, stopped when the test ends. The sentinels are redis-server
// --sentinel, so no package beyond redis-server is needed.
//
// The sentinels declare a master down after 1 s without an answer, so a
// failover takes 2–4 s. The nodes do not persist: a node killed and started
// again comes back empty, as a replica of the new master, and resyncs.
type Sentinel struct {
	t   testing.TB
	dir string
	bin string

	mu        sync.Mutex
	nodes     [2]*proc // the two data nodes; which is master changes
	sentinels [3]*proc
}

type proc struct {
	port string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) addr() string { return "127.0.0.1:" + p.port }

// StartSentinel starts the deployment and returns once the sentinels know
// each other and the replica, so that a failover can start at once.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	skipShort(t, "a Redis Sentinel deployment")
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found (scripts/services.sh installs it): %v", err)
	}
	s := &Sentinel{t: t, dir: t.TempDir(), bin: bin}
	t.Cleanup(s.stopAll)
	master := s.startNode(0, "")
	replica := s.startNode(1, master.addr())
	// Each sentinel is told its peers and the replica up front: found by
	// themselves, through hello messages and the master's INFO every 10 s,
	// they take about 20 s to be ready for a failover.
	var ports, ids []string
	for range s.sentinels {
		ports, ids = append(ports, freePort(t)), append(ids, randomHex(20))
	}
	for i := range s.sentinels {
		known := "sentinel known-replica " + SentinelMaster + " 127.0.0.1 " + replica.port + "\n"
		for j := range s.sentinels {
			if j != i {
				known += fmt.Sprintf("sentinel known-sentinel %s 127.0.0.1 %s %s\n", SentinelMaster, ports[j], ids[j])
			}
		}
		s.startSentinel(i, ports[i], ids[i], master.port, known)
	}
	s.waitSteady(master.addr())
	return s
}

// URL is the Klaxon URL of the deployment: redis+sentinel://…/mymaster/0.
func (s *Sentinel) URL() string {
	var addrs []string
	for _, p := range s.sentinels {
		addrs = append(addrs, p.addr())
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + SentinelMaster + "/0"
}

// MasterAddr is the master's host:port as the first sentinel announces it.
func (s *Sentinel) MasterAddr() string {
	s.t.Helper()
	addr, err := s.askMaster(s.sentinels[0])
	if err != nil {
		s.t.Fatalf("testenv: ask sentinel for the master: %v", err)
	}
	return addr
}

// Master returns a client of the current master, closed when the test ends.
func (s *Sentinel) Master() *redis.Client {
	s.t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.MasterAddr()})
	s.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// KillMaster SIGKILLs the master and waits for the failover (AwaitFailover).
// It returns the old and the new master.
func (s *Sentinel) KillMaster() (old, promoted string) {
	s.t.Helper()
	old = s.Kill()
	return old, s.AwaitFailover(old)
}

// Kill SIGKILLs the master and returns its address at once, while no
// master answers yet.
func (s *Sentinel) Kill() (old string) {
	s.t.Helper()
	old = s.MasterAddr()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		if n.addr() == old {
			s.kill(n)
		}
	}
	return old
}

// AwaitFailover, after Kill, waits until every sentinel announces the
// replica as the new master and it answers as one, then starts the killed
// node again as a replica of the new master and waits until the sentinels
// could fail over once more. It returns the master then: the promoted
// replica, or the killed node if the sentinels failed over again.
func (s *Sentinel) AwaitFailover(killed string) (promoted string) {
	s.t.Helper()
	i := s.nodeIndex(killed)
	promoted = s.nodes[1-i].addr()
	s.waitMaster(promoted)
	s.startNode(i, promoted)
	return s.waitSteady(promoted)
}

// PauseReplica stops the replica (SIGSTOP) and has the master drop its
// link (CLIENT KILL TYPE replica), so that nothing written from now on
// waits for it in a socket buffer: until ResumeReplica, and after it if
// the master is gone by then, the master alone holds what it acknowledges,
// as with a replica lagging behind. It returns the replica's address.
func (s *Sentinel) PauseReplica() string {
	s.t.Helper()
	replica := s.signalReplica(syscall.SIGSTOP)
	m := redis.NewClient(&redis.Options{Addr: s.MasterAddr()})
	defer m.Close()
	if err := m.Do(context.Background(), "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		s.t.Fatalf("testenv: cut the replica's link: %v", err)
	}
	return replica
}

// ResumeReplica lets the paused replica run again (SIGCONT).
func (s *Sentinel) ResumeReplica() string {
	s.t.Helper()
	return s.signalReplica(syscall.SIGCONT)
}

func (s *Sentinel) signalReplica(sig syscall.Signal) string {
	s.t.Helper()
	replica := s.nodes[1-s.nodeIndex(s.MasterAddr())]
	if err := replica.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testenv: %v to the replica %s: %v", sig, replica.addr(), err)
	}
	return replica.addr()
}

// Failover asks a sentinel for a planned failover (SENTINEL FAILOVER): the
// replica is promoted and the old master made its replica. It returns once
// the deployment is steady again, with the old and the new master (as
// waitSteady found it). Clients
// may write to the old master until it is told to follow the new one:
// such writes are acknowledged and then lost, as in any Redis failover.
func (s *Sentinel) Failover() (old, promoted string) {
	s.t.Helper()
	old = s.MasterAddr()
	promoted = s.nodes[1-s.nodeIndex(old)].addr()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0].addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Failover(ctx, SentinelMaster).Err(); err != nil {
		s.t.Fatalf("testenv: SENTINEL FAILOVER: %v", err)
	}
	s.waitMaster(promoted)
	return old, s.waitSteady(promoted)
}

func (s *Sentinel) nodeIndex(addr string) int {
	for i, n := range s.nodes {
		if n.addr() == addr {
			return i
		}
	}
	s.t.Fatalf("testenv: %s is none of the sentinel deployment's nodes", addr)
	return 0
}

// startNode starts data node i (on its port if it ran before), as a
// replica of master unless master is "".
func (s *Sentinel) startNode(i int, master string) *proc {
	s.t.Helper()
	s.mu.Lock()
	port := ""
	if s.nodes[i] != nil {
		port = s.nodes[i].port
	}
	s.mu.Unlock()
	if port == "" {
		port = freePort(s.t)
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--dbfilename", "node-" + port + ".rdb", "--logfile", filepath.Join(s.dir, "node-"+port+".log")}
	if master != "" {
		h, p, _ := net.SplitHostPort(master)
		args = append(args, "--replicaof", h, p)
	}
	p := s.spawn(port, args...)
	s.mu.Lock()
	s.nodes[i] = p
	s.mu.Unlock()
	return p
}

func (s *Sentinel) startSentinel(i int, port, id, masterPort, known string) {
	s.t.Helper()
	conf := filepath.Join(s.dir, fmt.Sprintf("sentinel-%d.conf", i))
	text := fmt.Sprintf(`port %s
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %s 2
sentinel down-after-milliseconds %[4]s 1000
sentinel failover-timeout %[4]s 5000
sentinel parallel-syncs %[4]s 1
sentinel myid %[6]s
%[7]s`, port, s.dir, filepath.Join(s.dir, fmt.Sprintf("sentinel-%d.log", i)), SentinelMaster, masterPort, id, known)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.sentinels[i] = s.spawn(port, conf, "--sentinel")
}

// spawn runs redis-server with args and waits until port answers PING.
func (s *Sentinel) spawn(port string, args ...string) *proc {
	s.t.Helper()
	cmd := exec.Command(s.bin, args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start redis-server %v: %v", args, err)
	}
	p := &proc{port: port, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1})
	defer c.Close()
	s.waitFor("redis-server on "+p.addr()+" to answer", func() (bool, string) {
		select {
		case <-p.done:
			s.t.Fatalf("testenv: redis-server %v exited; logs in %s", args, s.dir)
		default:
		}
		err := c.Ping(context.Background()).Err()
		return err == nil, fmt.Sprint(err)
	})
	return p
}

// waitMaster waits until every sentinel announces addr as the master and
// addr answers as a master.
func (s *Sentinel) waitMaster(addr string) {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	s.waitFor(addr+" promoted", func() (bool, string) {
		for _, p := range s.sentinels {
			got, err := s.askMaster(p)
			if err != nil || got != addr {
				return false, fmt.Sprintf("sentinel %s says %s (%v)", p.addr(), got, err)
			}
		}
		role, err := c.Do(context.Background(), "ROLE").Slice()
		if err != nil || len(role) == 0 || role[0] != "master" {
			return false, fmt.Sprintf("ROLE %v (%v)", role, err)
		}
		return true, ""
	})
}

// waitSteady waits until the sentinels agree on a master that has its
// replica online and caught up, and every sentinel knows the replica
// healthy and the two other sentinels: a failover could start now and
// elect a leader. It returns that master: expected, unless the sentinels
// failed over again meanwhile (a node busy past down-after-milliseconds on
// a loaded machine), which a test takes as one failover more.
func (s *Sentinel) waitSteady(expected string) (master string) {
	s.t.Helper()
	s.waitFor("the sentinel deployment steady around "+expected, func() (bool, string) {
		ctx := context.Background()
		master = ""
		for _, p := range s.sentinels {
			got, err := s.askMaster(p)
			if err != nil || master != "" && got != master {
				return false, fmt.Sprintf("sentinel %s says %s (%v), another %s", p.addr(), got, err, master)
			}
			master = got
		}
		replica := s.nodes[1-s.nodeIndex(master)].addr()
		m := redis.NewClient(&redis.Options{Addr: master, MaxRetries: -1})
		info, err := m.Info(ctx, "replication").Result()
		_ = m.Close()
		if err != nil || !strings.Contains(info, "role:master") || !strings.Contains(info, "state=online") {
			return false, fmt.Sprintf("master %s replication: %q (%v)", master, info, err)
		}
		for _, p := range s.sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: p.addr(), MaxRetries: -1})
			replicas, err := c.Replicas(ctx, SentinelMaster).Result()
			peers, err2 := c.Sentinels(ctx, SentinelMaster).Result()
			_ = c.Close()
			if err != nil || err2 != nil || len(peers) != len(s.sentinels)-1 {
				return false, fmt.Sprintf("sentinel %s: %d peers (%v, %v)", p.addr(), len(peers), err, err2)
			}
			healthy := false
			for _, r := range replicas {
				if r["name"] == replica && r["flags"] == "slave" {
					healthy = true
				}
			}
			if !healthy {
				return false, fmt.Sprintf("sentinel %s replicas: %v", p.addr(), replicas)
			}
		}
		return true, ""
	})
	if master != expected {
		s.t.Logf("testenv: the sentinels failed over again, from %s to %s", expected, master)
	}
	return master
}

func (s *Sentinel) askMaster(p *proc) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: p.addr(), MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	hp, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// waitFor polls cond for up to 60 s (a failover whose first election
// splits is tried again after twice the failover timeout).
func (s *Sentinel) waitFor(what string, cond func() (bool, string)) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("testenv: timed out waiting for %s: %s (logs in %s)", what, last, s.dir)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

func (s *Sentinel) kill(p *proc) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (s *Sentinel) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.sentinels {
		s.kill(p)
	}
	for _, p := range s.nodes {
		s.kill(p)
	}
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// SentinelPhaseEnv runs the tests that fail a Sentinel deployment over.
// Their failovers are timed by the sentinels, which a machine busy with
// every other test's workers slows into extra elections: scripts/test.sh
// sets it in a phase of its own, after the other tests.
const SentinelPhaseEnv = "KLAXON_TEST_SENTINEL"

// SentinelPhase skips t unless SentinelPhaseEnv is 1.
func SentinelPhase(t testing.TB) {
	t.Helper()
	if os.Getenv(SentinelPhaseEnv) != "1" {
		t.Skipf("fails Redis over with its own sentinels; set %s=1 to run it alone (scripts/test.sh does)", SentinelPhaseEnv)
	}
}
