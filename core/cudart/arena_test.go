package cudart

import (
	"errors"
	"testing"

	"github.com/resin-llm/resin/core/kvslab"
)

var _ kvslab.Arena = (*DeviceArena)(nil)

func TestDeviceArenaWithoutMemory(t *testing.T) {
	var a DeviceArena
	if err := a.Copy(0, 8, 8); !errors.Is(err, ErrClosed) {
		t.Fatalf("Copy on an unallocated arena = %v, want ErrClosed", err)
	}
	if a.Size() != 0 || a.Close() != nil {
		t.Fatal("an unallocated arena should be empty and close cleanly")
	}
}
