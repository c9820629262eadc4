package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// proc is the host's /proc; every reading below goes through procfs.
func proc() (procfs.FS, error) { return procfs.NewFS(procfs.DefaultMountPoint) }

// processCPU is the CPU time (user + system) pid has used so far.
func processCPU(pid int) (time.Duration, error) {
	fs, err := proc()
	if err != nil {
		return 0, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	return time.Duration(math.Round(st.CPUTime() * float64(time.Second))), nil
}

// peakRSS is VmHWM, the largest resident set pid has had.
func peakRSS(pid int) (int64, error) {
	fs, err := proc()
	if err != nil {
		return 0, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	return int64(st.VmHWM), nil
}

// findProcess returns the pid of the process named comm whose command line
// contains hint, in the proc filesystem mounted at mount, or 0 when there
// is none. With several matches it takes one that listens on TCP port (the
// broker the bench talks to, when another node runs beside it), if any;
// among those left, the one that started first: a server outlives the
// short-lived tools that share its name (RabbitMQ's rabbitmqctl is a
// beam.smp too), whatever their pids once pids wrap.
func findProcess(mount, comm, hint string, port uint64) int {
	fs, err := procfs.NewFS(mount)
	if err != nil {
		return 0
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return 0
	}
	listening := listeners(fs, port)
	best, bestStart, bestListens := 0, uint64(0), false
	for _, p := range procs {
		if c, err := p.Comm(); err != nil || c != comm {
			continue
		}
		if args, err := p.CmdLine(); hint != "" && (err != nil || !slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, hint) })) {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		listens := holdsSocket(p, listening)
		older := best == 0 || st.Starttime < bestStart || st.Starttime == bestStart && p.PID < best
		if listens && !bestListens || listens == bestListens && older {
			best, bestStart, bestListens = p.PID, st.Starttime, listens
		}
	}
	return best
}

// listeners are the inodes of the sockets listening on TCP port (none for
// port 0).
func listeners(fs procfs.FS, port uint64) map[uint64]bool {
	const tcpListen = 0x0A // st in /proc/net/tcp
	inodes := map[uint64]bool{}
	if port == 0 {
		return inodes
	}
	for _, read := range []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6} {
		lines, err := read()
		if err != nil {
			continue // no IPv6, say
		}
		for _, l := range lines {
			if l.St == tcpListen && l.LocalPort == port {
				inodes[l.Inode] = true
			}
		}
	}
	return inodes
}

// holdsSocket reports whether p has one of the sockets inodes open.
func holdsSocket(p procfs.Proc, inodes map[uint64]bool) bool {
	if len(inodes) == 0 {
		return false
	}
	targets, err := p.FileDescriptorTargets()
	if err != nil {
		return false
	}
	for _, t := range targets {
		var inode uint64
		if _, err := fmt.Sscanf(t, "socket:[%d]", &inode); err == nil && inodes[inode] {
			return true
		}
	}
	return false
}

// isProcess reports whether pid is a local process whose name starts with comm.
func isProcess(pid int, comm string) bool {
	fs, err := proc()
	if err != nil || pid <= 0 {
		return false
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return false
	}
	c, err := p.Comm()
	return err == nil && strings.HasPrefix(c, comm)
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute averages.
func loadAverage() [3]float64 {
	fs, err := proc()
	if err != nil {
		return [3]float64{}
	}
	l, err := fs.LoadAvg()
	if err != nil {
		return [3]float64{}
	}
	return [3]float64{l.Load1, l.Load5, l.Load15}
}

// cpuSet samples the CPU time of named groups of processes.
type cpuSet map[string][]int

// sample reads every process' CPU time; a process that is gone counts 0.
func (s cpuSet) sample() map[string]time.Duration {
	out := make(map[string]time.Duration, len(s))
	for name, pids := range s {
		for _, pid := range pids {
			if pid <= 0 {
				continue
			}
			d, err := processCPU(pid)
			if err == nil {
				out[name] += d
			}
		}
	}
	return out
}

// hostTime is what /proc/stat says of all CPUs together: seconds busy,
// and seconds in all.
type hostTime struct{ busy, total float64 }

// hostCPU reads the host's CPU time so far. Idle and iowait are the time
// no CPU worked; guest time is already inside user, so it is not added
// again.
func hostCPU() (hostTime, error) {
	fs, err := proc()
	if err != nil {
		return hostTime{}, err
	}
	st, err := fs.Stat()
	if err != nil {
		return hostTime{}, fmt.Errorf("read host cpu: %w", err)
	}
	c := st.CPUTotal
	busy := c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	return hostTime{busy: busy, total: busy + c.Idle + c.Iowait}, nil
}

// busySince is the share of all CPUs' time that was busy since before,
// every process of the host counted: 0 when nothing can be said.
func (t hostTime) busySince(before hostTime) float64 {
	if t.total <= before.total {
		return 0
	}
	// At most 1: with no idle time between, float rounding can pass it.
	return min((t.busy-before.busy)/(t.total-before.total), 1)
}

// load is what a span of time cost the host: how busy its CPUs were
// (busySince), and the CPU time of each named group of processes.
type load struct {
	busy    float64
	elapsed time.Duration
	cpu     map[string]time.Duration
}

// loadWhile runs f and returns what it cost the host and each of procs'
// groups meanwhile; busy is 0 when /proc/stat cannot be read.
func loadWhile(procs cpuSet, f func() error) (load, error) {
	before, berr := hostCPU()
	cpu, start := procs.sample(), time.Now()
	err := f()
	l := load{elapsed: time.Since(start), cpu: procs.sample()}
	for name, d := range cpu {
		l.cpu[name] -= d
	}
	if after, aerr := hostCPU(); berr == nil && aerr == nil {
		l.busy = after.busySince(before)
	}
	return l, err
}

// cores is how many CPUs each group kept busy on average over the span.
func (l load) cores() map[string]float64 {
	out := make(map[string]float64, len(l.cpu))
	for name, d := range l.cpu {
		if l.elapsed > 0 {
			out[name] = d.Seconds() / l.elapsed.Seconds()
		}
	}
	return out
}
