package cudart

import (
	"fmt"

	"github.com/ebitengine/purego"
)

// Capture modes (CUstreamCaptureMode).
const (
	// CaptureGlobal makes potentially unsafe calls (cuMemAlloc, a synchronising copy, work
	// on the legacy stream) fail on every thread of the process while any capture runs. It
	// breaks the other devices' threads, which keep working during a capture: avoid it.
	CaptureGlobal = 0
	// CaptureThreadLocal makes unsafe calls fail only on the capturing thread. Each
	// Device runs on its own OS thread, so this is the mode Capture uses: a mistake
	// inside the captured function is caught, other devices carry on.
	CaptureThreadLocal = 1
	// CaptureRelaxed lets even the capturing thread make unsafe calls.
	CaptureRelaxed = 2
)

// Graph is a captured sequence of stream work.
type Graph struct{ h uintptr }

// GraphExec is an instantiated graph, replayed with LaunchGraph.
type GraphExec struct {
	h    uintptr
	call [2]uintptr // cuGraphLaunch's arguments, kept here so LaunchGraph allocates nothing
}

// BeginCapture starts recording the work queued on s (not the default stream) into a graph.
// Prefer Capture, which ends the capture on every path.
func (c *Ctx) BeginCapture(s *Stream, mode int) error {
	if s.handle() == 0 {
		return fmt.Errorf("cudart: capture needs a created stream, not the default stream")
	}
	return c.api.check("cuStreamBeginCapture_v2", c.api.cuStreamBeginCapture(s.h, int32(mode)))
}

// EndCapture stops recording on s and returns the graph.
func (c *Ctx) EndCapture(s *Stream) (*Graph, error) {
	var g uintptr
	if err := c.api.check("cuStreamEndCapture", c.api.cuStreamEndCapture(s.handle(), &g)); err != nil {
		if g != 0 {
			c.api.cuGraphDestroy(g)
		}
		return nil, err
	}
	return &Graph{h: g}, nil
}

// Capturing reports whether s is recording a graph (also true for a capture an illegal
// call has invalidated, which still has to be ended).
func (c *Ctx) Capturing(s *Stream) (bool, error) {
	var st int32 // CU_STREAM_CAPTURE_STATUS_NONE, _ACTIVE, _INVALIDATED
	if err := c.api.check("cuStreamIsCapturing", c.api.cuStreamIsCapturing(s.handle(), &st)); err != nil {
		return false, err
	}
	return st != 0, nil
}

// AbortCapture ends the capture running on s, if any, and discards what it recorded, so s
// is usable again for eager work or another capture. The driver's complaint about an
// invalidated capture is the expected outcome here, not an error.
func (c *Ctx) AbortCapture(s *Stream) error {
	on, err := c.Capturing(s)
	if err != nil || !on {
		return err
	}
	var g uintptr
	r := c.api.cuStreamEndCapture(s.handle(), &g)
	if g != 0 {
		c.api.cuGraphDestroy(g)
	}
	if r != 0 && r != errStreamCaptureInvalidated && r != errStreamCaptureUnjoined {
		return c.api.check("cuStreamEndCapture", r)
	}
	return nil
}

// CUresult codes a failed capture ends with.
const (
	errStreamCaptureInvalidated = 901 // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	errStreamCaptureUnjoined    = 904 // CUDA_ERROR_STREAM_CAPTURE_UNJOINED
)

// Capture records the work fn queues on s (a created stream) and returns it instantiated,
// ready for LaunchGraph. It captures in thread-local mode, so other devices' threads are
// not disturbed. When fn fails, or the capture or instantiation does, the capture is ended
// and everything recorded is discarded: s is left usable and the error is returned. fn
// must only queue work on s (launches, async copies, cuBLASLt calls); it must not
// synchronise, allocate device memory or use the default stream, which invalidates the
// capture.
func (c *Ctx) Capture(s *Stream, fn func() error) (*GraphExec, error) {
	if err := c.BeginCapture(s, CaptureThreadLocal); err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	if err := fn(); err != nil {
		if aerr := c.AbortCapture(s); aerr != nil {
			return nil, fmt.Errorf("capture: %w (ending the capture also failed: %v)", err, aerr)
		}
		return nil, fmt.Errorf("capture: %w", err)
	}
	g, err := c.EndCapture(s)
	if err != nil {
		c.AbortCapture(s) // a capture the driver would not end must not stay open
		return nil, fmt.Errorf("capture: %w", err)
	}
	defer c.DestroyGraph(g)
	e, err := c.Instantiate(g)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	return e, nil
}

// Instantiate makes an executable graph.
func (c *Ctx) Instantiate(g *Graph) (*GraphExec, error) {
	if g == nil || g.h == 0 {
		return nil, fmt.Errorf("instantiate: %w", ErrClosed)
	}
	var e uintptr
	if err := c.api.check("cuGraphInstantiateWithFlags", c.api.cuGraphInstantiate(&e, g.h, 0)); err != nil {
		return nil, err
	}
	return &GraphExec{h: e}, nil
}

// LaunchGraph replays e on s. It allocates nothing.
func (c *Ctx) LaunchGraph(e *GraphExec, s *Stream) error {
	if e == nil || e.h == 0 {
		return fmt.Errorf("launch graph: %w", ErrClosed)
	}
	e.call = [2]uintptr{e.h, s.handle()}
	r, _, _ := purego.SyscallN(c.api.graphLaunch, e.call[:]...)
	if int32(r) != 0 {
		return c.api.check("cuGraphLaunch", int32(r))
	}
	return nil
}

// DestroyGraph releases a graph (its instantiations stay valid).
func (c *Ctx) DestroyGraph(g *Graph) error {
	if g == nil || g.h == 0 {
		return nil
	}
	err := c.api.check("cuGraphDestroy", c.api.cuGraphDestroy(g.h))
	g.h = 0
	return err
}

// DestroyGraphExec releases an executable graph.
func (c *Ctx) DestroyGraphExec(e *GraphExec) error {
	if e == nil || e.h == 0 {
		return nil
	}
	err := c.api.check("cuGraphExecDestroy", c.api.cuGraphExecDestroy(e.h))
	e.h = 0
	return err
}
