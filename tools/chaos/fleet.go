package main

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// fleet runs N worker processes, one per slot, and replaces the one it
// kills. Every process gets its own log file.
type fleet struct {
	bin string
	env []string // common environment
	dir string   // log files
	log *slog.Logger

	mu         sync.Mutex
	slots      []*worker
	starts     []int // per slot
	all        []*worker
	kills      int
	unexpected []string // processes that exited without being told to
	stopped    bool
	faults     []span // Redis faults, from injection to recovery
	// sent indexes each process' "notification sent" lines (sentLines).
	sent map[string]map[string]bool
}

// span is a stretch of time.
type span struct{ from, to time.Time }

// worker is one process.
type worker struct {
	name string // "w2#5": slot 2, fifth start
	slot int
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed once reaped

	// Under fleet.mu.
	killedAt time.Time // when we SIGKILLed it
	stopping bool      // we sent SIGTERM
	exit     error     // set before done closes
}

func newFleet(bin string, env []string, dir string, n int, log *slog.Logger) *fleet {
	return &fleet{bin: bin, env: env, dir: dir, log: log, slots: make([]*worker, n), starts: make([]int, n)}
}

// workerEnv is the environment of every worker: this process' own, without
// any Klaxon setting (nor Hawk's aliases) that could leak into the run, plus
// the run's settings.
func workerEnv(settings map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "KLAXON_"), name == "REGISTRY_URL", name == "REDIS_URL", name == "MONGO_ACCOUNTS_DATABASE_URI":
			continue
		}
		env = append(env, kv)
	}
	for k, v := range settings {
		env = append(env, k+"="+v)
	}
	return env
}

// startAll starts every slot.
func (f *fleet) startAll() error {
	for slot := range f.slots {
		if err := f.start(slot); err != nil {
			return err
		}
	}
	return nil
}

// start starts a process in slot.
func (f *fleet) start(slot int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return nil
	}
	f.starts[slot]++
	name := fmt.Sprintf("w%d#%d", slot+1, f.starts[slot])
	path := filepath.Join(f.dir, strings.ReplaceAll(name, "#", "-")+".log")
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("log file of %s: %w", name, err)
	}
	cmd := exec.Command(f.bin)
	// Port 0: each process gets its own free port from the kernel when it
	// binds, so a restart never collides with a port taken meanwhile.
	cmd.Env = append(append([]string(nil), f.env...), "KLAXON_HTTP_ADDR=127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s (%s): %w", name, f.bin, err)
	}
	w := &worker{name: name, slot: slot, log: path, cmd: cmd, done: make(chan struct{})}
	f.slots[slot] = w
	f.all = append(f.all, w)
	go f.reap(w, out)
	return nil
}

// reap waits for w to exit. A process that exits without being killed or
// told to stop is a finding: it is recorded, and replaced after a moment.
func (f *fleet) reap(w *worker, out *os.File) {
	err := w.cmd.Wait()
	out.Close()
	f.mu.Lock()
	w.exit = err
	unexpected := w.killedAt.IsZero() && !w.stopping
	switch {
	case unexpected:
		f.unexpected = append(f.unexpected, fmt.Sprintf("%s exited by itself (%v); log %s", w.name, err, w.log))
	case w.stopping && w.killedAt.IsZero() && err != nil:
		f.unexpected = append(f.unexpected, fmt.Sprintf("%s exited with %v after SIGTERM; log %s", w.name, err, w.log))
	}
	replace := unexpected && !f.stopped && f.slots[w.slot] == w
	f.mu.Unlock()
	if unexpected {
		f.log.Error("worker exited by itself", "worker", w.name, "error", err, "log", w.log)
	}
	close(w.done)
	if replace {
		// Not synchronisation: a pause so a worker that cannot start does
		// not spin.
		time.AfterFunc(200*time.Millisecond, func() {
			f.mu.Lock()
			again := !f.stopped && f.slots[w.slot] == w
			f.mu.Unlock()
			if again {
				if err := f.start(w.slot); err != nil {
					f.log.Error("restart worker", "slot", w.slot+1, "error", err)
				}
			}
		})
	}
}

// kill SIGKILLs the process in slot, waits until it is gone and starts
// another in its place.
func (f *fleet) kill(ctx context.Context, slot int) error {
	f.mu.Lock()
	w := f.slots[slot]
	if f.stopped || w == nil {
		f.mu.Unlock()
		return nil
	}
	w.killedAt = time.Now()
	f.kills++
	f.mu.Unlock()
	if err := w.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", w.name, err)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return f.start(slot)
}

// current returns the process of every slot.
func (f *fleet) current() []*worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*worker(nil), f.slots...)
}

// waitReady waits until every slot's process consumes: each queue has a
// consumer per slot.
func (f *fleet) waitReady(ctx context.Context, b *broker, queues ...string) error {
	for {
		ready := true
		for _, q := range queues {
			if n, err := b.consumers(q); err != nil || n < len(f.slots) {
				ready = false
			}
		}
		if ready {
			return nil
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for %d consumers on %v: %w", len(f.slots), queues, err)
		}
	}
}

// stopAll sends SIGTERM to every process and waits for them: docs/contract.md §7
// says a worker exits 0 within 10 s. One that does not is killed and
// recorded. Later starts are refused until resume.
func (f *fleet) stopAll(ctx context.Context) {
	f.mu.Lock()
	f.stopped = true
	var ws []*worker
	for _, w := range f.slots {
		if w != nil && !w.stopping {
			w.stopping = true
			ws = append(ws, w)
		}
	}
	f.mu.Unlock()
	for _, w := range ws {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, w := range ws {
		grace := time.NewTimer(12 * time.Second)
		select {
		case <-w.done:
		case <-grace.C:
		case <-ctx.Done():
		}
		grace.Stop()
		select {
		case <-w.done:
		default:
			f.mu.Lock()
			w.killedAt = time.Now()
			f.mu.Unlock()
			_ = w.cmd.Process.Kill()
			<-w.done
			f.mu.Lock()
			f.unexpected = append(f.unexpected, fmt.Sprintf("%s did not stop within 12 s of SIGTERM; log %s", w.name, w.log))
			f.mu.Unlock()
		}
	}
}

// resume allows starts again after stopAll and starts every slot.
func (f *fleet) resume() error {
	f.mu.Lock()
	f.stopped = false
	f.mu.Unlock()
	return f.startAll()
}

// pids names the live processes by pid.
func (f *fleet) pids() map[int]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int]string, len(f.slots))
	for _, w := range f.slots {
		if w != nil {
			out[w.cmd.Process.Pid] = w.name
		}
	}
	return out
}

// killTime is when the named process was SIGKILLed, or zero.
func (f *fleet) killTime(name string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.all {
		if w.name == name {
			return w.killedAt
		}
	}
	return time.Time{}
}

// faulted records a Redis fault, from its injection until it was over.
func (f *fleet) faulted(from, to time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, span{from, to})
}

// faultEnd is the end of the Redis fault under way at t (or starting
// within crashWindow after it), or zero if there was none.
func (f *fleet) faultEnd(t time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.faults {
		if !t.Before(s.from.Add(-crashWindow)) && !t.After(s.to) {
			return s.to
		}
	}
	return time.Time{}
}

// unrecorded reports whether the named process logged that Redis refused
// to record its send of firing firingID, in message messageID: its
// "notification sent" line for the message says recorded=false, or the
// deliverer's "record <keys> as sent: …" error names the firing's key,
// "<prefix>:sent:<id>:<channel>" (logged at warn for the first batch a
// consumer holds only, the others at debug).
func (f *fleet) unrecorded(name, firingID, messageID string) bool {
	if logged, recorded := f.sentLine(name, messageID); logged && !recorded {
		return true
	}
	for line := range f.logLines(name) {
		if strings.Contains(line, `"err":"record `) && strings.Contains(line, ":sent:"+firingID+":") &&
			strings.Contains(line, " as sent: ") {
			return true
		}
	}
	return false
}

// logLines are the lines of the named process' log, none when it cannot
// be read.
func (f *fleet) logLines(name string) iter.Seq[string] {
	f.mu.Lock()
	var path string
	for _, w := range f.all {
		if w.name == name {
			path = w.log
		}
	}
	f.mu.Unlock()
	b, err := os.ReadFile(path)
	if path == "" || err != nil {
		return func(func(string) bool) {}
	}
	return strings.Lines(string(b))
}

// recorded reports whether the named process logged that it sent message
// id (the webhook's Idempotency-Key) and recorded it in Redis.
func (f *fleet) recorded(name, id string) bool {
	_, recorded := f.sentLine(name, id)
	return recorded
}

// sentLine looks in the named process' log for the deliverer's
// "notification sent" line of message id, written once the record is made
// or refused: logged reports one with its recorded attribute, recorded
// that it says true.
func (f *fleet) sentLine(name, id string) (logged, recorded bool) {
	recorded, logged = f.sentLines(name)[id]
	return logged, recorded
}

// sentLines indexes the named process' "notification sent" lines by
// message id, true where one says recorded=true; a line without its
// recorded attribute is left out. The log is read once, when the checker
// first asks: the run is over by then, and it asks for every request.
func (f *fleet) sentLines(name string) map[string]bool {
	f.mu.Lock()
	idx, ok := f.sent[name]
	f.mu.Unlock()
	if ok {
		return idx
	}
	idx = map[string]bool{}
	for line := range f.logLines(name) {
		if !strings.Contains(line, `"msg":"notification sent"`) {
			continue
		}
		_, rest, ok := strings.Cut(line, `"notification_id":"`)
		id, _, closed := strings.Cut(rest, `"`)
		if !ok || !closed {
			continue
		}
		switch {
		case strings.Contains(line, `"recorded":true`):
			idx[id] = true
		case strings.Contains(line, `"recorded":false`):
			if _, seen := idx[id]; !seen {
				idx[id] = false
			}
		}
	}
	f.mu.Lock()
	if f.sent == nil {
		f.sent = map[string]map[string]bool{}
	}
	f.sent[name] = idx
	f.mu.Unlock()
	return idx
}

// killedBetween reports whether any process was SIGKILLed within [from, to].
func (f *fleet) killedBetween(from, to time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.all {
		if !w.killedAt.IsZero() && !w.killedAt.Before(from) && !w.killedAt.After(to) {
			return true
		}
	}
	return false
}

// counts returns how many processes were started and killed, and what
// exited unexpectedly.
func (f *fleet) counts() (starts, kills int, unexpected []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.all), f.kills, append([]string(nil), f.unexpected...)
}

// pause waits for d or until ctx ends: the pace of a poll, never a wait
// for something to have happened.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
