package weights

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrTooLarge reports that building something would take more memory than the machine has
// available.
var ErrTooLarge = errors.New("weights: more memory than is available")

// AvailableMemory returns the memory the kernel says a new allocation can take without
// swapping (MemAvailable in /proc/meminfo), and false where that cannot be read.
func AvailableMemory() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 && fs[0] == "MemAvailable:" {
			if kb, err := strconv.ParseInt(fs[1], 10, 64); err == nil {
				return kb * 1024, true
			}
		}
	}
	return 0, false
}

// CheckMemory refuses, with an error naming what and both figures, to build n bytes when
// the machine has less available: a full-size config's random weights then get an error
// instead of the out-of-memory killer. Where the available memory cannot be read it allows.
func CheckMemory(n int64, what string) error {
	avail, ok := AvailableMemory()
	if !ok || n <= avail {
		return nil
	}
	return fmt.Errorf("%w: %s need %.1f GiB, the machine has %.1f GiB available", ErrTooLarge, what, float64(n)/(1<<30), float64(avail)/(1<<30))
}
