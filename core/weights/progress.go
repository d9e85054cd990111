package weights

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Progress is how far a checkpoint load has come: the distinct tensors read so far (a
// quantized weight and its scale count as two) and their bytes as stored, out of
// everything the checkpoint holds. Done is set once, by Close, when the load is over;
// a model that skips some tensors (mtp.*, say) ends with Tensors < TotalTensors.
type Progress struct {
	Tensors, TotalTensors int
	Bytes, TotalBytes     int64
	Done                  bool
}

// ProgressFunc receives a Checkpoint's progress after every tensor read and once from
// Close. Calls are serialized, even when tensors are read from several goroutines.
type ProgressFunc func(Progress)

// progressEvery is how often TerminalProgress redraws its line.
const progressEvery = 200 * time.Millisecond

// TerminalProgress returns a ProgressPrinter on stderr redrawing at most every 200 ms when
// stderr is a terminal, and nil (no reports) otherwise: logs and pipes stay clean. Open
// installs it on every Checkpoint.
func TerminalProgress() ProgressFunc {
	st, err := os.Stderr.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return ProgressPrinter(os.Stderr, progressEvery)
}

// ProgressPrinter returns a ProgressFunc that writes "weights: 12/340 tensors, 1.2/5.3 GiB"
// to w, starting each report with a carriage return so that a terminal redraws one line,
// at most once per every (the first report always prints), and a final report ending in a
// newline when everything has been read or the load is over. Write errors are ignored.
func ProgressPrinter(w io.Writer, every time.Duration) ProgressFunc {
	p := &progressPrinter{w: w, every: every, now: time.Now}
	return p.report
}

type progressPrinter struct {
	w        io.Writer
	every    time.Duration
	now      func() time.Time
	start    time.Time
	last     time.Time
	started  bool
	finished bool
}

func (p *progressPrinter) report(r Progress) {
	if p.finished {
		return
	}
	now := p.now()
	if !p.started {
		p.start, p.started = now, true
	} else if !r.Done && r.Tensors < r.TotalTensors && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	line := fmt.Sprintf("\rweights: %d/%d tensors, %s/%s", r.Tensors, r.TotalTensors, byteSize(r.Bytes), byteSize(r.TotalBytes))
	if r.Done || r.Tensors >= r.TotalTensors {
		p.finished = true
		line += fmt.Sprintf(" in %.1fs\n", now.Sub(p.start).Seconds())
	}
	io.WriteString(p.w, line)
}

// byteSize writes n in binary units with one decimal ("512 B", "1.5 KiB", "5.3 GiB").
func byteSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n)/1024, "KiB"
	for _, u := range []string{"MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// loadProgress is a Checkpoint's count of what it has read.
type loadProgress struct {
	mu   sync.Mutex
	fn   ProgressFunc
	read map[string]bool
	now  Progress
}

// add counts the tensors named (each once) and reports when any was new.
func (l *loadProgress) add(c *Checkpoint, names ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fn == nil {
		return
	}
	added := false
	for _, n := range names {
		if l.read[n] {
			continue
		}
		added = true
		if l.read == nil {
			l.read = map[string]bool{}
		}
		l.read[n] = true
		info, _ := c.Info(n)
		l.now.Tensors++
		l.now.Bytes += info.Size
	}
	if added {
		l.fn(l.now)
	}
}

// finish sends the last report, once, if anything was read.
func (l *loadProgress) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fn == nil || l.now.Tensors == 0 || l.now.Done {
		return
	}
	l.now.Done = true
	l.fn(l.now)
}

// SetProgress replaces the function that receives the load's progress (Open installs
// TerminalProgress); nil silences it. Call it before reading tensors.
func (c *Checkpoint) SetProgress(fn ProgressFunc) {
	c.progress.mu.Lock()
	defer c.progress.mu.Unlock()
	c.progress.fn = fn
}
