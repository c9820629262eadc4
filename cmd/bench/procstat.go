package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// which Linux fixes at 100 for user space on every common architecture.
const clockTick = 10 * time.Millisecond

// parseStatCPU returns utime+stime from the contents of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may itself hold spaces
// and parentheses, so fields are counted from the last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	// After ") ": state(3) ppid(4) … utime(14) stime(15).
	fields, err := statFields(stat, 13)
	if err != nil {
		return 0, err
	}
	utime, err := strconv.ParseInt(fields[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	stime, err := strconv.ParseInt(fields[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// statFields are the fields of /proc/<pid>/stat after the command name,
// at least want of them: field 3 (state) is the first.
func statFields(stat []byte, want int) ([]string, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return nil, errors.New("no ')' after the command name")
	}
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < want {
		return nil, fmt.Errorf("%d fields after the command name, want at least %d", len(fields), want)
	}
	return fields, nil
}

// parseStatStart returns starttime (field 22) from /proc/<pid>/stat: when
// the process started, in clock ticks after boot.
func parseStatStart(stat []byte) (int64, error) {
	fields, err := statFields(stat, 20)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(fields[19], 10, 64)
}

// processCPU is the CPU time (user + system) pid has used so far.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	d, err := parseStatCPU(b)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return d, nil
}

// parseStatusKB returns a "Name:   123 kB" field of /proc/<pid>/status, in bytes.
func parseStatusKB(status []byte, name string) (int64, error) {
	for line := range strings.SplitSeq(string(status), "\n") {
		v, ok := strings.CutPrefix(line, name+":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", name, v, err)
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("no %s line", name)
}

// peakRSS is VmHWM, the largest resident set pid has had.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	n, err := parseStatusKB(b, "VmHWM")
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return n, nil
}

// findProcess returns the pid of the process named comm (as in
// /proc/<pid>/comm) whose command line contains hint, or 0 when there is
// none. With several matches it returns the one that started first: a
// server outlives the short-lived tools that share its name (RabbitMQ's
// rabbitmqctl is a beam.smp too), whatever their pids once pids wrap.
func findProcess(proc, comm, hint string) int {
	dirs, _ := filepath.Glob(filepath.Join(proc, "[0-9]*"))
	best, bestStart := 0, int64(0)
	for _, dir := range dirs {
		c, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		if hint != "" {
			cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
			if err != nil || !bytes.Contains(cmdline, []byte(hint)) {
				continue
			}
		}
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		start, err := parseStatStart(stat)
		if err != nil {
			continue
		}
		if best == 0 || start < bestStart || start == bestStart && pid < best {
			best, bestStart = pid, start
		}
	}
	return best
}

// isProcess reports whether pid is a local process whose name starts with comm.
func isProcess(pid int, comm string) bool {
	c, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(c)), comm)
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute averages.
func loadAverage() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
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

// hostTicks is what /proc/stat's "cpu" line says of all CPUs together:
// ticks busy, and ticks in all.
type hostTicks struct{ busy, total int64 }

// parseHostStat reads the first line of /proc/stat, "cpu  user nice system
// idle iowait irq softirq steal …": idle and iowait are the ticks no CPU
// worked; guest time is already inside user, so it is not added again.
func parseHostStat(stat []byte) (hostTicks, error) {
	line, _, _ := bytes.Cut(stat, []byte{'\n'})
	fields := strings.Fields(string(line))
	if len(fields) < 9 || fields[0] != "cpu" {
		return hostTicks{}, fmt.Errorf("first line %q is not cpu user nice system idle iowait irq softirq steal", line)
	}
	var t hostTicks
	for i, f := range fields[1:9] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return hostTicks{}, fmt.Errorf("field %d of the cpu line: %w", i+1, err)
		}
		t.total += n
		if i != 3 && i != 4 { // idle, iowait
			t.busy += n
		}
	}
	return t, nil
}

// hostCPU reads the host's CPU ticks so far.
func hostCPU() (hostTicks, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTicks{}, fmt.Errorf("read host cpu: %w", err)
	}
	return parseHostStat(b)
}

// busySince is the share of all CPUs' time that was busy since before,
// every process of the host counted: 0 when nothing can be said.
func (t hostTicks) busySince(before hostTicks) float64 {
	if t.total <= before.total {
		return 0
	}
	return float64(t.busy-before.busy) / float64(t.total-before.total)
}

// busyWhile runs f and returns how busy the host's CPUs were meanwhile
// (busySince), 0 when /proc/stat cannot be read.
func busyWhile(f func() error) (float64, error) {
	before, berr := hostCPU()
	err := f()
	after, aerr := hostCPU()
	if berr != nil || aerr != nil {
		return 0, err
	}
	return after.busySince(before), err
}
