package weights

import (
	"errors"
	"testing"
)

func TestCheckMemory(t *testing.T) {
	avail, ok := AvailableMemory()
	if !ok {
		t.Skip("no /proc/meminfo here")
	}
	if avail <= 0 {
		t.Fatalf("available memory %d", avail)
	}
	if err := CheckMemory(1<<20, "a small tensor"); err != nil {
		t.Errorf("1 MiB refused: %v", err)
	}
	err := CheckMemory(avail+1<<40, "random weights")
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
}
