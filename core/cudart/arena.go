package cudart

import (
	"errors"
	"fmt"
)

// DeviceArena is a kvslab.Arena in device memory: one allocation that the slab pool cuts
// into pages, which kernels address as Ptr(offset).
type DeviceArena struct {
	dev    *Device
	buf    Buffer
	stream *Stream // where Copy queues its copies; nil: the legacy stream, with waits
}

// SetStream makes Copy queue its copies on s, the stream of the runner whose kernels read
// and write the arena: a copy is then ordered after the step that wrote src and before
// the next step, with no wait on the device. Set it before the pool first copies; s must
// outlive the arena's use.
func (a *DeviceArena) SetStream(s *Stream) { a.stream = s }

// NewDeviceArena allocates a zeroed arena of size bytes on d.
func NewDeviceArena(d *Device, size int64) (*DeviceArena, error) {
	if d == nil {
		if _, err := loadDriver(); err != nil {
			return nil, fmt.Errorf("device arena: %w", err)
		}
		return nil, errors.New("device arena: nil device")
	}
	if size <= 0 {
		return nil, fmt.Errorf("device arena: size must be positive, got %d", size)
	}
	a := &DeviceArena{dev: d}
	err := d.Do(func(c *Ctx) error {
		b, err := c.Alloc(size)
		if err != nil {
			return err
		}
		// cuMemsetD8 may return before it ends, on the legacy stream: wait, so that no
		// kernel on a runner's non-blocking stream reads the arena before it is zero.
		err = c.Memset(b.Ptr, 0, size)
		if err == nil {
			err = c.Synchronize()
		}
		if err != nil {
			c.Free(b)
			return err
		}
		a.buf = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("device arena of %d bytes: %w", size, err)
	}
	return a, nil
}

// Download copies the whole arena to the host, after the device's queued work (tests
// compare two runners' caches byte for byte with it; a dump of a pool reads it).
func (a *DeviceArena) Download() ([]byte, error) {
	b := make([]byte, a.buf.Size)
	err := a.dev.Do(func(c *Ctx) error {
		if err := c.Synchronize(); err != nil {
			return err
		}
		return c.CopyDtoH(b, a.buf.Ptr)
	})
	if err != nil {
		return nil, fmt.Errorf("device arena: download: %w", err)
	}
	return b, nil
}

// Size implements kvslab.Arena.
func (a *DeviceArena) Size() int64 { return a.buf.Size }

// Ptr returns the device address of byte off.
func (a *DeviceArena) Ptr(off int64) DevicePtr { return a.buf.Ptr.Add(off) }

// Copy implements kvslab.Arena: it copies n bytes from offset src to offset dst on the
// device. With a stream set (SetStream) the copy is queued there and Copy returns without
// waiting: the runner's later work on that stream sees dst complete. Without one it runs on
// the legacy stream, which does not order against the runners' non-blocking streams, so it
// waits for the device before and after the copy. It runs through Device.Do, so it must
// not be called from inside Do (use CopyAsync there).
func (a *DeviceArena) Copy(dst, src, n int64) error {
	if err := a.checkCopy(dst, src, n); err != nil || n == 0 {
		return err
	}
	return a.dev.Do(func(c *Ctx) error {
		if a.stream != nil {
			return c.CopyDtoDAsync(a.Ptr(dst), a.Ptr(src), n, a.stream)
		}
		if err := c.Synchronize(); err != nil {
			return err
		}
		if err := c.CopyDtoD(a.Ptr(dst), a.Ptr(src), n); err != nil {
			return err
		}
		return c.Synchronize()
	})
}

// CopyAsync queues the copy of n bytes from offset src to offset dst on s, inside
// Device.Do: a runner executing the plan's cache copies before its forward calls it on its
// own stream.
func (a *DeviceArena) CopyAsync(c *Ctx, s *Stream, dst, src, n int64) error {
	if err := a.checkCopy(dst, src, n); err != nil || n == 0 {
		return err
	}
	if c.dev != a.dev {
		return fmt.Errorf("device arena copy: context of device %d, arena on device %d", c.dev.Info.Ordinal, a.dev.Info.Ordinal)
	}
	return c.CopyDtoDAsync(a.Ptr(dst), a.Ptr(src), n, s)
}

func (a *DeviceArena) checkCopy(dst, src, n int64) error {
	if a.buf.Ptr == 0 {
		return fmt.Errorf("device arena copy: %w", ErrClosed)
	}
	for _, off := range []int64{dst, src} {
		if off < 0 || n < 0 || off+n > a.buf.Size {
			return fmt.Errorf("device arena copy: range [%d, %d) outside an arena of %d bytes", off, off+n, a.buf.Size)
		}
	}
	if dst < src+n && src < dst+n && n > 0 {
		return fmt.Errorf("device arena copy: ranges [%d, %d) and [%d, %d) overlap", src, src+n, dst, dst+n)
	}
	return nil
}

// Close frees the arena's memory.
func (a *DeviceArena) Close() error {
	if a.buf.Ptr == 0 {
		return nil
	}
	b := a.buf
	a.buf = Buffer{}
	return a.dev.Do(func(c *Ctx) error { return c.Free(b) })
}
