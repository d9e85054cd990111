package cudart

import (
	"errors"
	"slices"
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

func TestDeviceArenaCopyRanges(t *testing.T) {
	a := &DeviceArena{buf: Buffer{Ptr: 0x1000, Size: 64}}
	for _, c := range []struct{ dst, src, n int64 }{
		{0, 60, 8}, {-8, 0, 8}, {0, 8, -1}, {60, 0, 8}, {0, 4, 8}, {8, 4, 8},
	} {
		if err := a.Copy(c.dst, c.src, c.n); err == nil {
			t.Errorf("Copy(%d, %d, %d) on 64 bytes: no error", c.dst, c.src, c.n)
		}
	}
	if err := a.Copy(0, 8, 0); err != nil {
		t.Errorf("an empty copy: %v", err)
	}
}

// TestDeviceArenaCopyOrdering checks the calls Copy makes: one copy queued on the
// runner's stream when it has one, and the legacy copy fenced by two device waits without.
func TestDeviceArenaCopyOrdering(t *testing.T) {
	r := &recorder{}
	d := fakeDevice(t, fakeDriverRecording(t, r))
	a := &DeviceArena{dev: d, buf: Buffer{Ptr: 0x1000, Size: 64}}
	if err := a.Copy(32, 0, 16); err != nil {
		t.Fatal(err)
	}
	want := []string{"ctxsync", "dtod 0x1020<-0x1000 16", "ctxsync"}
	if !slices.Equal(r.log, want) {
		t.Fatalf("without a stream: %q, want %q", r.log, want)
	}
	r.log = nil
	a.SetStream(&Stream{h: 0x77})
	if err := a.Copy(48, 16, 8); err != nil {
		t.Fatal(err)
	}
	if want := []string{"dtod-async 0x1030<-0x1010 8 on 0x77"}; !slices.Equal(r.log, want) {
		t.Fatalf("with a stream: %q, want %q", r.log, want)
	}
	r.log = nil
	err := d.Do(func(c *Ctx) error { return a.CopyAsync(c, &Stream{h: 0x88}, 0, 8, 8) })
	if want := []string{"dtod-async 0x1000<-0x1008 8 on 0x88"}; err != nil || !slices.Equal(r.log, want) {
		t.Fatalf("CopyAsync: %v, %q, want %q", err, r.log, want)
	}
	other := fakeDevice(t, d.api)
	other.Info.Ordinal = 1
	if err := other.Do(func(c *Ctx) error { return a.CopyAsync(c, &Stream{h: 1}, 0, 8, 8) }); err == nil {
		t.Fatal("a copy through another device's context was accepted")
	}
}
