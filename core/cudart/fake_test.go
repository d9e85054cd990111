package cudart

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"
)

// recorder is a fake CUDA driver for the calls the stream-ordering and capture code makes:
// each call is logged as text, so a test states the exact sequence it expects.
type recorder struct {
	log       []string
	capturing bool  // the stream is capturing
	endResult int32 // what cuStreamEndCapture returns
	endGraph  uintptr
}

func (r *recorder) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

// fakeDriverRecording returns fakeDriver's hot calls plus logging stand-ins for the rest.
func fakeDriverRecording(t testing.TB, r *recorder) *driverAPI {
	d := fakeDriver(t)
	d.cuCtxSynchronize = func() int32 { r.logf("ctxsync"); return 0 }
	d.cuMemcpyDtoD = func(dst, src uintptr, n uint64) int32 { r.logf("dtod %#x<-%#x %d", dst, src, n); return 0 }
	d.cuMemcpyDtoDAsync = func(dst, src uintptr, n uint64, s uintptr) int32 {
		r.logf("dtod-async %#x<-%#x %d on %#x", dst, src, n, s)
		return 0
	}
	d.cuMemcpyHtoDAsync = func(dst uintptr, src unsafe.Pointer, n uint64, s uintptr) int32 {
		r.logf("htod-async %#x %d on %#x", dst, n, s)
		return 0
	}
	d.cuStreamBeginCapture = func(s uintptr, mode int32) int32 {
		r.logf("begin %#x mode %d", s, mode)
		r.capturing = true
		return 0
	}
	d.cuStreamIsCapturing = func(s uintptr, st *int32) int32 {
		*st = 0
		if r.capturing {
			*st = 1
		}
		return 0
	}
	d.cuStreamEndCapture = func(s uintptr, g *uintptr) int32 {
		r.logf("end %#x", s)
		r.capturing = false
		*g = r.endGraph
		return r.endResult
	}
	d.cuGraphDestroy = func(g uintptr) int32 { r.logf("destroy graph %#x", g); return 0 }
	d.cuGraphInstantiate = func(e *uintptr, g uintptr, flags uint64) int32 {
		r.logf("instantiate %#x", g)
		*e = g + 1
		return 0
	}
	d.cuGetErrorName = func(int32, **byte) int32 { return 1 }
	d.cuGetErrorString = func(int32, **byte) int32 { return 1 }
	return d
}

// fakeDevice is a Device whose thread runs calls against api, with no GPU behind it.
func fakeDevice(t testing.TB, api *driverAPI) *Device {
	d := &Device{api: api, calls: make(chan func())}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		runtime.LockOSThread() // as a real device thread; never unlocked, so the thread ends with it
		for fn := range d.calls {
			fn()
		}
	}()
	t.Cleanup(func() { d.Close() })
	return d
}
