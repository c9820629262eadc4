package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress shows what the bench is doing on stderr. On a terminal it is a
// bar redrawn in place (\r) ten times a second; otherwise one line per
// finished phase. Phases are sequential.
type progress struct {
	w   io.Writer
	tty bool

	mu    sync.Mutex
	name  string
	total int64
	start time.Time
	done  *atomic.Int64 // the current phase's counter, updated by the phase
	stop  chan struct{}
	wg    sync.WaitGroup
}

// newProgress writes to w; mode is "auto" (a bar when w is a terminal),
// "bar", "lines" or "off".
func newProgress(w io.Writer, mode string) *progress {
	if mode == "off" {
		return &progress{w: io.Discard}
	}
	tty := mode == "bar"
	if f, ok := w.(*os.File); ok && mode == "auto" {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progress{w: w, tty: tty}
}

// phase ends the current phase and starts one of total units (0: unknown);
// the caller advances the returned counter.
func (p *progress) phase(name string, total int64) *atomic.Int64 {
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.name, p.total, p.start, p.done = name, total, time.Now(), new(atomic.Int64)
	if p.tty {
		p.stop = make(chan struct{})
		p.wg.Add(1)
		go p.draw(p.stop, p.done)
	}
	return p.done
}

func (p *progress) draw(stop chan struct{}, done *atomic.Int64) {
	defer p.wg.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		p.mu.Lock()
		fmt.Fprint(p.w, "\r"+renderBar(p.name, done.Load(), p.total, time.Since(p.start), 30)+"\x1b[K")
		p.mu.Unlock()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// end finishes the current phase, if any, with its final line.
func (p *progress) end() {
	p.mu.Lock()
	stop, done := p.stop, p.done
	p.stop = nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		p.wg.Wait()
	}
	if done == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	line := renderBar(p.name, done.Load(), p.total, time.Since(p.start), 30)
	if p.tty {
		fmt.Fprint(p.w, "\r"+line+"\x1b[K\n")
	} else {
		fmt.Fprintln(p.w, line)
	}
	p.done = nil
}

// note prints a line between phases.
func (p *progress) note(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.stop != nil {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// renderBar draws one progress line:
//
//	fill          [#########.....................]  31%  31,000/100,000  25,731/s  1.2s
func renderBar(name string, done, total int64, elapsed time.Duration, width int) string {
	rate := ""
	if s := elapsed.Seconds(); s > 0 {
		rate = thousands(float64(done)/s) + "/s"
	}
	secs := fmt.Sprintf("%.1fs", elapsed.Seconds())
	if total <= 0 {
		return fmt.Sprintf("%-28s %s  %s  %s", name, thousands(float64(done)), rate, secs)
	}
	frac := min(max(float64(done)/float64(total), 0), 1)
	filled := int(frac * float64(width))
	bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
	return fmt.Sprintf("%-28s [%s] %3.0f%%  %s/%s  %s  %s", name, bar, frac*100,
		thousands(float64(done)), thousands(float64(total)), rate, secs)
}
