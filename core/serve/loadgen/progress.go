package loadgen

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress draws a run's advance on a writer. On a terminal it redraws one bar at most
// every RedrawEvery; elsewhere (a log file, a pipe) it writes a plain line every
// LineEvery or every tenth of the requests, whichever comes first, so that logs stay
// short. Update is a Config.Progress; Finish ends the output after the run.
type Progress struct {
	w        io.Writer
	terminal bool
	now      func() time.Time

	mu        sync.Mutex
	start     time.Time // when the first request was sent
	last      time.Time // when the last bar or line was written
	lastTenth int       // tenths of the requests done at the last line
	tally     Tally     // the latest tally
	written   bool      // the latest tally has been written
}

// Throttles of the two forms of progress.
const (
	RedrawEvery = 100 * time.Millisecond
	LineEvery   = 5 * time.Second
)

// NewProgress returns a Progress on w, drawn as a bar when terminal is set.
func NewProgress(w io.Writer, terminal bool) *Progress {
	return &Progress{w: w, terminal: terminal, now: time.Now}
}

// Update records a tally and writes it when its throttle allows.
func (p *Progress) Update(t Tally) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if p.start.IsZero() {
		p.start, p.last = now, now
	}
	p.tally, p.written = t, false
	done := t.Done()
	if done == 0 {
		return
	}
	tenth := 10 * done / max(t.Total, 1)
	switch {
	case done == t.Total:
	case p.terminal && now.Sub(p.last) >= RedrawEvery:
	case !p.terminal && (now.Sub(p.last) >= LineEvery || tenth > p.lastTenth):
	default:
		return
	}
	p.write(now, tenth)
}

// Finish writes the latest tally if it was held back, and ends the bar's line.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.written && !p.start.IsZero() {
		now := p.now()
		p.write(now, 10*p.tally.Done()/max(p.tally.Total, 1))
	}
	if p.terminal && !p.start.IsZero() {
		fmt.Fprintln(p.w)
	}
}

func (p *Progress) write(now time.Time, tenth int) {
	t := p.tally
	elapsed := now.Sub(p.start)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(t.Done()) / elapsed.Seconds()
	}
	problems := ""
	if t.Failed > 0 || t.Cancelled > 0 {
		problems = fmt.Sprintf(", %d failed", t.Failed)
		if t.Cancelled > 0 {
			problems += fmt.Sprintf(", %d cancelled", t.Cancelled)
		}
	}
	if p.terminal {
		const width = 30
		filled := width * t.Done() / max(t.Total, 1)
		fmt.Fprintf(p.w, "\r[%s%s] %d/%d%s  %.1f req/s\x1b[K", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), t.Done(), t.Total, problems, rate)
	} else {
		fmt.Fprintf(p.w, "progress: %d/%d requests (%d%%)%s, %.1f req/s, %.1f s\n",
			t.Done(), t.Total, 100*t.Done()/max(t.Total, 1), problems, rate, elapsed.Seconds())
	}
	p.last, p.lastTenth, p.written = now, tenth, true
}
