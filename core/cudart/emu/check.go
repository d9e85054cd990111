package emu

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// AllSchedules runs run once under every schedule, each time from the state mem had
// when it was called, and reports an error naming the first buffer and byte that ends
// differently under two schedules (or run's own error). mem is the memory the kernels
// read and write (Go heap byte slices, whose addresses the launches pass); it is left as
// the Forward schedule, run last, left it. seed is passed to run for the Random and
// WarpAhead schedules.
func AllSchedules(mem [][]byte, seed uint64, run func(s Schedule, seed uint64) error) error {
	before := snapshot(mem)
	var first [][]byte
	order := []Schedule{Reverse, Random, WarpAhead, Forward}
	for _, s := range order {
		for i := range mem {
			copy(mem[i], before[i])
		}
		if err := run(s, seed); err != nil {
			return fmt.Errorf("%v schedule: %w", s, err)
		}
		after := snapshot(mem)
		if first == nil {
			first = after
			continue
		}
		for i := range after {
			if !bytes.Equal(after[i], first[i]) {
				at := 0
				for at < len(after[i]) && after[i][at] == first[i][at] {
					at++
				}
				return fmt.Errorf("emu: buffer %d differs at byte %d between the %v and %v schedules", i, at, order[0], s)
			}
		}
	}
	return nil
}

func snapshot(mem [][]byte) [][]byte {
	s := make([][]byte, len(mem))
	for i, b := range mem {
		s[i] = append([]byte(nil), b...)
	}
	return s
}

// Report appends line to the file named by $RESIN_EMU_SUMMARY, when set: test binaries
// report their emulated time and counts there, and scripts/test.sh prints the file after
// go test (which shows a passing package's output only with -v).
func Report(line string) error {
	path := os.Getenv("RESIN_EMU_SUMMARY")
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("emu: summary: %w", err)
	}
	_, err = fmt.Fprintln(f, strings.TrimRight(line, "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
