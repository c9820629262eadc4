package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisInfo is what the bench reads from INFO: counters to take deltas of.
type redisInfo struct {
	calls       map[string]int64 // commandstats: calls per command (lower case)
	usec        map[string]int64 // commandstats: µs spent per command
	writes      int64            // total_writes_processed: reply writes to clients
	reads       int64            // total_reads_processed
	usedMemory  int64            // used_memory, bytes
	processID   int
	version     string
	commandsAll int64 // total_commands_processed
}

// parseInfo reads the fields of INFO the bench needs from its text.
func parseInfo(text string) redisInfo {
	info := redisInfo{calls: map[string]int64{}, usec: map[string]int64{}}
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimRight(line, "\r")
		key, value, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if name, isCmd := strings.CutPrefix(key, "cmdstat_"); isCmd {
			name = strings.ToLower(name)
			for field := range strings.SplitSeq(value, ",") {
				if v, ok := strings.CutPrefix(field, "calls="); ok {
					info.calls[name], _ = strconv.ParseInt(v, 10, 64)
				}
				if v, ok := strings.CutPrefix(field, "usec="); ok {
					info.usec[name], _ = strconv.ParseInt(v, 10, 64)
				}
			}
			continue
		}
		n, _ := strconv.ParseInt(value, 10, 64)
		switch key {
		case "total_writes_processed":
			info.writes = n
		case "total_reads_processed":
			info.reads = n
		case "used_memory":
			info.usedMemory = n
		case "process_id":
			info.processID = int(n)
		case "redis_version":
			info.version = value
		case "total_commands_processed":
			info.commandsAll = n
		}
	}
	return info
}

func readInfo(ctx context.Context, rdb *redis.Client) (redisInfo, error) {
	text, err := rdb.Info(ctx, "server", "stats", "memory", "commandstats").Result()
	if err != nil {
		return redisInfo{}, fmt.Errorf("redis INFO: %w", err)
	}
	return parseInfo(text), nil
}

// redisDelta is what Redis did between two INFO snapshots, per event.
type redisDelta struct {
	// RoundTrips is the increase of total_writes_processed: Redis writes
	// replies once per client read it served, so this is the client round
	// trips (a pipeline larger than Redis' 16 KiB read buffer may take
	// two). The bench's own first INFO is taken off.
	RoundTrips int64 `json:"roundTrips"`
	// Commands is every command Redis ran, those run by scripts included
	// (commandstats counts both), INFO left out.
	Commands int64 `json:"commands"`
	// Scripts is EVALSHA and EVAL calls.
	Scripts int64 `json:"scripts"`
	// Calls is the increase of calls per command.
	Calls map[string]int64 `json:"calls"`
	// Micros is the increase of the time Redis spent in each command, µs.
	// A script's time includes the commands it calls, which commandstats
	// also counts on their own.
	Micros map[string]int64 `json:"usec"`
	// ScriptMicros is the time spent in EVALSHA/EVAL; ScriptCommandMicros
	// the part of it spent in the commands the scripts called (every
	// command but the scripts themselves, INFO, PING and HELLO, and GET and
	// TIME, which Klaxon sends outside scripts: an estimate that leaves out
	// the few GETs inside them); the rest is Lua. DirectMicros is the time
	// of the commands sent outside scripts (GET, TIME).
	ScriptMicros        int64 `json:"scriptUsec"`
	ScriptCommandMicros int64 `json:"scriptCommandUsec"`
	DirectMicros        int64 `json:"directUsec"`
}

func diffInfo(before, after redisInfo) redisDelta {
	d := redisDelta{RoundTrips: max(after.writes-before.writes-1, 0), Calls: map[string]int64{}, Micros: map[string]int64{}}
	for name, n := range after.calls {
		if name == "info" {
			continue
		}
		delta := n - before.calls[name]
		if delta <= 0 {
			continue
		}
		us := after.usec[name] - before.usec[name]
		d.Calls[name], d.Micros[name] = delta, us
		d.Commands += delta
		switch name {
		case "evalsha", "eval", "evalsha_ro", "eval_ro":
			d.Scripts += delta
			d.ScriptMicros += us
		case "ping", "hello", "script|load", "client|setinfo", "select":
		case "get", "time":
			d.DirectMicros += us
		default:
			d.ScriptCommandMicros += us
		}
	}
	return d
}

// topCalls lists the commands of d by calls, most first: "evalsha=1200 get=800".
func (d redisDelta) topCalls(n int) string {
	names := make([]string, 0, len(d.Calls))
	for name := range d.Calls {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if d.Calls[names[i]] != d.Calls[names[j]] {
			return d.Calls[names[i]] > d.Calls[names[j]]
		}
		return names[i] < names[j]
	})
	var parts []string
	for i, name := range names {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, d.Calls[name]))
	}
	return strings.Join(parts, " ")
}

// deleteKeys removes every key that starts with prefix and returns how
// many there were.
func deleteKeys(ctx context.Context, rdb *redis.Client, prefix string) (int, error) {
	n := 0
	iter := rdb.Scan(ctx, 0, prefix+"*", 5000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("unlink keys of %s: %w", prefix, err)
		}
		n += len(batch)
		batch = batch[:0]
		return nil
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, fmt.Errorf("scan keys of %s: %w", prefix, err)
	}
	return n, flush()
}

// keyStats classifies the keys under prefix: a group's state string
// ("…}:s"), the pages of ids of busy groups ("…}:d:…"), firing records
// ("…}:f"), users sets ("…}:u:…") and the rest. It reads the header of up
// to sample state strings for the ids they hold inline (8 bytes each), and
// measures MEMORY USAGE of up to sample keys of each kind.
type keyStats struct {
	States       int     `json:"stateKeys"`
	Pages        int     `json:"pageKeys"`
	Other        int     `json:"otherKeys"`
	StateBytes   float64 `json:"stateKeyBytes"` // mean MEMORY USAGE of a state key
	InlineBytes  float64 `json:"inlineIdBytes"` // mean bytes of ids inside a state key
	PageBytes    float64 `json:"pageKeyBytes"`
	SampledCount int     `json:"sampled"`
}

// stateHeader is the fixed head of a group's state string (observe.lua's
// HDR): version, then per dedup slot (current, previous) slot, level,
// next, count and inline bytes, then tokens and section counts.
const stateHeader = 75

func scanKeyStats(ctx context.Context, rdb *redis.Client, prefix string, sample int) (keyStats, error) {
	var ks keyStats
	var states, pages []string
	iter := rdb.Scan(ctx, 0, prefix+"*", 5000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		switch {
		case strings.HasSuffix(k, "}:s"):
			ks.States++
			if len(states) < sample {
				states = append(states, k)
			}
		case strings.Contains(k, "}:d:"):
			ks.Pages++
			if len(pages) < sample {
				pages = append(pages, k)
			}
		default:
			ks.Other++
		}
	}
	if err := iter.Err(); err != nil {
		return ks, fmt.Errorf("scan keys of %s: %w", prefix, err)
	}
	mean := func(keys []string) (float64, error) {
		if len(keys) == 0 {
			return 0, nil
		}
		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.MemoryUsage(ctx, k, 0) // SAMPLES 0: every element
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("memory usage: %w", err)
		}
		var total int64
		for _, c := range cmds {
			total += c.(*redis.IntCmd).Val()
		}
		return float64(total) / float64(len(keys)), nil
	}
	var err error
	if ks.StateBytes, err = mean(states); err != nil {
		return ks, err
	}
	if ks.PageBytes, err = mean(pages); err != nil {
		return ks, err
	}
	if len(states) > 0 {
		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range states {
				p.GetRange(ctx, k, 0, stateHeader-1)
			}
			return nil
		})
		if err != nil {
			return ks, fmt.Errorf("read state headers: %w", err)
		}
		var inline int64
		for _, c := range cmds {
			h := []byte(c.(*redis.StringCmd).Val())
			if len(h) < stateHeader {
				continue
			}
			// Inline bytes of the current and previous slots: u32 at 16 and 35.
			inline += int64(binary.LittleEndian.Uint32(h[16:])) + int64(binary.LittleEndian.Uint32(h[35:]))
		}
		ks.InlineBytes = float64(inline) / float64(len(states))
	}
	ks.SampledCount = len(states) + len(pages)
	return ks, nil
}
