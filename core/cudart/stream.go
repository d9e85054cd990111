package cudart

import "fmt"

// Stream is a CUDA stream. A nil *Stream is the legacy default stream.
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
