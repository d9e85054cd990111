package cudart

import (
	"fmt"
	"math"
)

// Stream is a CUDA stream. A nil *Stream is the legacy default stream, which does not order
// against the non-blocking streams NewStream makes: a runner queues all its work (launches,
// async copies, GEMMs, graph replays) on its own stream and never on nil.
type Stream struct{ h uintptr }

func (s *Stream) handle() uintptr {
	if s == nil {
		return 0
	}
	return s.h
}

const streamNonBlocking = 1

// NewStream creates a stream that does not synchronise with the default stream.
func (c *Ctx) NewStream() (*Stream, error) {
	var h uintptr
	if err := c.api.check("cuStreamCreate", c.api.cuStreamCreate(&h, streamNonBlocking)); err != nil {
		return nil, err
	}
	return &Stream{h: h}, nil
}

// Sync waits for the work queued on s.
func (c *Ctx) Sync(s *Stream) error {
	return c.api.check("cuStreamSynchronize", c.api.cuStreamSynchronize(s.handle()))
}

// DestroyStream releases s.
func (c *Ctx) DestroyStream(s *Stream) error {
	if s == nil || s.h == 0 {
		return nil
	}
	err := c.api.check("cuStreamDestroy_v2", c.api.cuStreamDestroy(s.h))
	s.h = 0
	return err
}

// Event marks a point in a stream; two events give the GPU time between them.
type Event struct{ h uintptr }

// NewEvent creates an event that records timing.
func (c *Ctx) NewEvent() (*Event, error) {
	var h uintptr
	if err := c.api.check("cuEventCreate", c.api.cuEventCreate(&h, 0)); err != nil {
		return nil, err
	}
	return &Event{h: h}, nil
}

const eventDisableTiming = 2 // CU_EVENT_DISABLE_TIMING

// NewFence creates an event without timing, the cheap kind used only to order work: record
// it after a copy, then Wait on it from another stream or Query/SyncEvent it from the host
// before reusing the copy's pinned buffer.
func (c *Ctx) NewFence() (*Event, error) {
	var h uintptr
	if err := c.api.check("cuEventCreate", c.api.cuEventCreate(&h, eventDisableTiming)); err != nil {
		return nil, err
	}
	return &Event{h: h}, nil
}

// Wait makes later work on s wait for e's recorded point, without blocking the host.
func (c *Ctx) Wait(s *Stream, e *Event) error {
	return c.api.check("cuStreamWaitEvent", c.api.cuStreamWaitEvent(s.handle(), e.h, 0))
}

const errNotReady = 600 // CUDA_ERROR_NOT_READY

// Query reports whether the work before e's recorded point has finished, without waiting.
func (c *Ctx) Query(e *Event) (bool, error) {
	r := c.api.cuEventQuery(e.h)
	if r == errNotReady {
		return false, nil
	}
	if err := c.api.check("cuEventQuery", r); err != nil {
		return false, err
	}
	return true, nil
}

// SyncEvent blocks the host until the work before e's recorded point has finished.
func (c *Ctx) SyncEvent(e *Event) error {
	return c.api.check("cuEventSynchronize", c.api.cuEventSynchronize(e.h))
}

// Record queues e on s.
func (c *Ctx) Record(e *Event, s *Stream) error {
	return c.api.check("cuEventRecord", c.api.cuEventRecord(e.h, s.handle()))
}

// Elapsed waits for end and returns the milliseconds between start and end.
func (c *Ctx) Elapsed(start, end *Event) (float32, error) {
	if err := c.api.check("cuEventSynchronize", c.api.cuEventSynchronize(end.h)); err != nil {
		return 0, err
	}
	var ms float32
	if err := c.api.check("cuEventElapsedTime", c.api.cuEventElapsedTime(&ms, start.h, end.h)); err != nil {
		return 0, fmt.Errorf("elapsed time: %w", err)
	}
	return ms, nil
}

// DestroyEvent releases e.
func (c *Ctx) DestroyEvent(e *Event) error {
	if e == nil || e.h == 0 {
		return nil
	}
	err := c.api.check("cuEventDestroy_v2", c.api.cuEventDestroy(e.h))
	e.h = 0
	return err
}

// CopyBandwidth measures the device's memory bandwidth in bytes per second: an n-byte
// device-to-device copy on s reads and writes every byte (2n bytes moved), timed by
// events, the best of 5. The roofline figures of the GPU checks divide by it.
func (c *Ctx) CopyBandwidth(n int64, s *Stream) (float64, error) {
	a, err := c.Alloc(2 * n)
	if err != nil {
		return 0, err
	}
	defer c.Free(a)
	start, err := c.NewEvent()
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(start)
	end, err := c.NewEvent()
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(end)
	best := float32(math.MaxFloat32)
	for range 5 {
		if err := c.Record(start, s); err != nil {
			return 0, err
		}
		if err := c.CopyDtoDAsync(a.Ptr.Add(n), a.Ptr, n, s); err != nil {
			return 0, err
		}
		if err := c.Record(end, s); err != nil {
			return 0, err
		}
		ms, err := c.Elapsed(start, end)
		if err != nil {
			return 0, err
		}
		best = min(best, ms)
	}
	return 2 * float64(n) / (float64(max(best, 1e-6)) / 1e3), nil
}
