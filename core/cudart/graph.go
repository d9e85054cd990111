package cudart

import (
	"fmt"

	"github.com/ebitengine/purego"
)

// Capture modes (CUstreamCaptureMode).
const (
	CaptureGlobal      = 0
	CaptureThreadLocal = 1
	CaptureRelaxed     = 2
)

// Graph is a captured sequence of stream work.
type Graph struct{ h uintptr }

// GraphExec is an instantiated graph, replayed with LaunchGraph.
type GraphExec struct {
	h    uintptr
	call [2]uintptr // cuGraphLaunch's arguments, kept here so LaunchGraph allocates nothing
}

// BeginCapture starts recording the work queued on s (not the default stream) into a graph.
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
		return nil, err
	}
	return &Graph{h: g}, nil
}

// Instantiate makes an executable graph.
func (c *Ctx) Instantiate(g *Graph) (*GraphExec, error) {
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
