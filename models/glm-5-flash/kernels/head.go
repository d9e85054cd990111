package kernels

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// StreamMeanName is head.cu's entry point.
const StreamMeanName = "glm5flash_stream_mean"

// StreamMean is a launch of Out [Rows, Dim] = the mean of each row's HC streams
// (Streams [Rows, HC, Dim]), summed in stream order.
type StreamMean struct {
	Out, Streams  cudart.DevicePtr
	Rows, HC, Dim int
}

func (a StreamMean) spec(sp *spec) error {
	if a.Rows <= 0 || a.HC <= 0 || a.Dim <= 0 || a.Rows*a.HC*a.Dim > maxI32 {
		return fmt.Errorf("kernels: stream_mean: %d rows of %d streams of %d", a.Rows, a.HC, a.Dim)
	}
	sp.reset(StreamMeanName, cudart.D1((a.Rows*a.Dim+255)/256), cudart.D1(256), 0)
	sp.ptr(a.Out).ptr(a.Streams).i32(a.Rows).i32(a.HC).i32(a.Dim)
	return nil
}

// StreamMeanRef is StreamMean on host slices.
func StreamMeanRef(out, streams []float32, rows, hc, dim int) error {
	if rows <= 0 || hc <= 0 || dim <= 0 || len(out) < rows*dim || len(streams) < rows*hc*dim {
		return fmt.Errorf("kernels: stream_mean: %d rows of %d streams of %d, buffers of %d and %d", rows, hc, dim, len(out), len(streams))
	}
	for r := range rows {
		o := out[r*dim : (r+1)*dim]
		clear(o)
		for k := range hc {
			for d := range dim {
				o[d] += streams[(r*hc+k)*dim+d]
			}
		}
		for d := range dim {
			o[d] /= float32(hc)
		}
	}
	return nil
}
