// Package baseline holds the counting algorithms Klaxon is measured
// against, as Lua scripts: they are not Klaxon's and serve comparisons only
// (internal/counter's benchmark, tools/bench).
package baseline

import _ "embed"

// HawkLua is Hawk's fixed-window counter: a hash of start time and count
// per (project, rule, group, period), reset when the period is over.
//
//go:embed hawk.lua
var HawkLua string

// LogLua is the sorted-set log: every event a member, exact, memory per
// event.
//
//go:embed zlog.lua
var LogLua string

// FloorLua is not an algorithm: it issues the commands one event costs any
// idempotent counter (clock, state read, id check-and-record, state write)
// with no logic, the lower bound of a call's cost.
//
//go:embed floor.lua
var FloorLua string
