package loadgen

import (
	"strings"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestProgressLinesWhenNotTerminal(t *testing.T) {
	t.Run("every tenth", func(t *testing.T) {
		var out strings.Builder
		clock := &fakeClock{t: time.Unix(0, 0)}
		p := NewProgress(&out, false)
		p.now = clock.now
		p.Update(Tally{Total: 100})
		for i := 1; i <= 100; i++ {
			clock.t = clock.t.Add(10 * time.Millisecond) // 1 s in all: no 5 s line
			p.Update(Tally{Completed: i, Total: 100})
		}
		p.Finish()
		lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		if len(lines) != 10 || strings.Contains(out.String(), "\r") {
			t.Fatalf("%d lines, want 10 plain ones:\n%s", len(lines), out.String())
		}
		if lines[0] != "progress: 10/100 requests (10%), 100.0 req/s, 0.1 s" || !strings.HasPrefix(lines[9], "progress: 100/100 requests (100%)") {
			t.Fatalf("lines:\n%s", out.String())
		}
	})
	t.Run("every 5 s", func(t *testing.T) {
		var out strings.Builder
		clock := &fakeClock{t: time.Unix(0, 0)}
		p := NewProgress(&out, false)
		p.now = clock.now
		p.Update(Tally{Total: 1000})
		for i := 1; i <= 22; i++ { // one a second: lines at 5, 10, 15, 20 s
			clock.t = clock.t.Add(time.Second)
			p.Update(Tally{Completed: i, Failed: i / 10, Total: 1000})
		}
		p.Finish() // interrupted: the latest tally is written once more
		want := []string{
			"progress: 5/1000 requests (0%), 1.0 req/s, 5.0 s",
			"progress: 11/1000 requests (1%), 1 failed, 1.1 req/s, 10.0 s",
			"progress: 16/1000 requests (1%), 1 failed, 1.1 req/s, 15.0 s",
			"progress: 22/1000 requests (2%), 2 failed, 1.1 req/s, 20.0 s",
			"progress: 24/1000 requests (2%), 2 failed, 1.1 req/s, 22.0 s",
		}
		if got := strings.TrimSuffix(out.String(), "\n"); got != strings.Join(want, "\n") {
			t.Fatalf("got\n%s\nwant\n%s", got, strings.Join(want, "\n"))
		}
	})
}

func TestProgressBarOnTerminalIsThrottled(t *testing.T) {
	var out strings.Builder
	clock := &fakeClock{t: time.Unix(0, 0)}
	p := NewProgress(&out, true)
	p.now = clock.now
	p.Update(Tally{Total: 100})
	for i := 1; i <= 100; i++ {
		clock.t = clock.t.Add(10 * time.Millisecond) // redraws every 10 updates, and the last
		p.Update(Tally{Completed: i, Total: 100})
	}
	p.Finish()
	s := out.String()
	if n := strings.Count(s, "\r"); n != 10 {
		t.Fatalf("%d redraws for 100 updates 10 ms apart, want 10:\n%q", n, s)
	}
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") || !strings.Contains(s, "] 100/100") {
		t.Fatalf("the bar should end once, full, with a newline: %q", s)
	}
}
