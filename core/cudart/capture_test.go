package cudart

import (
	"errors"
	"slices"
	"testing"
)

func TestCaptureSuccess(t *testing.T) {
	r := &recorder{endGraph: 0x500}
	c := &Ctx{api: fakeDriverRecording(t, r)}
	s := &Stream{h: 0x10}
	e, err := c.Capture(s, func() error {
		return c.CopyHtoDAsync(0x2000, []byte{1, 2, 3}, s)
	})
	if err != nil || e == nil || e.h != 0x501 {
		t.Fatalf("capture = %+v, %v", e, err)
	}
	// Thread-local mode (1), the queued copy, end, instantiate, and the template graph
	// released once instantiated.
	want := []string{"begin 0x10 mode 1", "htod-async 0x2000 3 on 0x10", "end 0x10", "instantiate 0x500", "destroy graph 0x500"}
	if !slices.Equal(r.log, want) {
		t.Fatalf("calls %q\nwant  %q", r.log, want)
	}
}

// TestCaptureAbort fails the captured function and checks that the capture is ended and
// its partial graph destroyed, so the stream is usable again.
func TestCaptureAbort(t *testing.T) {
	r := &recorder{endGraph: 0x600, endResult: errStreamCaptureInvalidated}
	c := &Ctx{api: fakeDriverRecording(t, r)}
	s := &Stream{h: 0x10}
	boom := errors.New("shape mismatch")
	e, err := c.Capture(s, func() error { return boom })
	if e != nil || !errors.Is(err, boom) {
		t.Fatalf("capture = %v, %v; want the function's error", e, err)
	}
	want := []string{"begin 0x10 mode 1", "end 0x10", "destroy graph 0x600"}
	if !slices.Equal(r.log, want) {
		t.Fatalf("calls %q\nwant  %q", r.log, want)
	}
	if on, err := c.Capturing(s); on || err != nil {
		t.Fatalf("stream still capturing after the abort: %v, %v", on, err)
	}
	// Aborting a stream that is not capturing does nothing.
	r.log = nil
	if err := c.AbortCapture(s); err != nil || len(r.log) != 0 {
		t.Fatalf("idle abort: %v, calls %q", err, r.log)
	}
	// The driver refusing to end a capture (an unsafe call invalidated it) fails Capture
	// with the driver's error and still leaves the stream out of capture mode.
	r.endResult, r.endGraph, r.log = errStreamCaptureInvalidated, 0, nil
	_, err = c.Capture(s, func() error { return nil })
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != errStreamCaptureInvalidated || r.capturing {
		t.Fatalf("invalidated capture: %v (capturing %v)", err, r.capturing)
	}
	if err := c.BeginCapture(nil, CaptureThreadLocal); err == nil {
		t.Fatal("capture on the default stream was accepted")
	}
}
