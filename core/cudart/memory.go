package cudart

import (
	"fmt"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uintptr

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int64) DevicePtr { return p + DevicePtr(off) }

// Buffer is a device allocation.
type Buffer struct {
	Ptr  DevicePtr
	Size int64
}

// Alloc allocates n bytes of device memory.
func (c *Ctx) Alloc(n int64) (Buffer, error) {
	if n <= 0 {
		return Buffer{}, fmt.Errorf("cudart: alloc of %d bytes: size must be positive", n)
	}
	var p uintptr
	if err := c.api.check("cuMemAlloc_v2", c.api.cuMemAlloc(&p, uint64(n))); err != nil {
		return Buffer{}, fmt.Errorf("alloc %d bytes on device %d: %w", n, c.dev.Info.Ordinal, err)
	}
	return Buffer{Ptr: DevicePtr(p), Size: n}, nil
}

// Free releases a buffer from Alloc.
func (c *Ctx) Free(b Buffer) error {
	if b.Ptr == 0 {
		return nil
	}
	return c.api.check("cuMemFree_v2", c.api.cuMemFree(uintptr(b.Ptr)))
}

// Memset sets n bytes at p to v. It is queued on the legacy default stream and may return
// before it ends (cuMemsetD8 does not synchronise with the host for device memory); it does
// not order against non-blocking streams. On a runner's path use MemsetAsync.
func (c *Ctx) Memset(p DevicePtr, v byte, n int64) error {
	return c.api.check("cuMemsetD8_v2", c.api.cuMemsetD8(uintptr(p), v, uint64(n)))
}

// MemsetAsync queues setting n bytes at p to v on s, ordered with s's other work.
func (c *Ctx) MemsetAsync(p DevicePtr, v byte, n int64, s *Stream) error {
	return c.api.check("cuMemsetD8Async", c.api.cuMemsetD8Async(uintptr(p), v, uint64(n), s.handle()))
}

// HostBuffer is page-locked host memory, which copies reach at full bus speed.
type HostBuffer struct {
	Bytes []byte
	ptr   unsafe.Pointer
	node  int  // the NUMA node its pages prefer, -1 when none was asked for
	own   bool // mapped by AllocHostOn and registered with the driver, not cuMemAllocHost
}

// Node returns the NUMA node h's pages were placed on by AllocHostOn, or -1.
func (h *HostBuffer) Node() int { return h.node }

// AllocHost allocates n bytes of page-locked host memory.
func (c *Ctx) AllocHost(n int64) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cudart: host alloc of %d bytes: size must be positive", n)
	}
	var p unsafe.Pointer
	if err := c.api.check("cuMemAllocHost_v2", c.api.cuMemAllocHost(&p, uint64(n))); err != nil {
		return nil, err
	}
	return &HostBuffer{Bytes: unsafe.Slice((*byte)(p), n), ptr: p, node: -1}, nil
}

// AllocHostOn allocates n bytes of page-locked host memory whose pages sit on NUMA node
// node: the memory is mapped, bound to the node (mbind, MPOL_PREFERRED), touched so every
// page is placed, then pinned with cuMemHostRegister. A negative node is AllocHost. Use
// it for the buffers a runner copies through every step (plan upload, sampled tokens),
// with the node BindNUMA chose, so those copies do not cross the socket link.
func (c *Ctx) AllocHostOn(n int64, node int) (*HostBuffer, error) {
	if node < 0 {
		return c.AllocHost(n)
	}
	if n <= 0 {
		return nil, fmt.Errorf("cudart: host alloc of %d bytes: size must be positive", n)
	}
	b, err := mapHost(n, node)
	if err != nil {
		return nil, fmt.Errorf("host alloc of %d bytes on node %d: %w", n, node, err)
	}
	p := unsafe.Pointer(&b[0])
	if err := c.api.check("cuMemHostRegister_v2", c.api.cuMemHostRegister(p, uint64(n), 0)); err != nil {
		unmapHost(b)
		return nil, fmt.Errorf("host alloc of %d bytes on node %d: %w", n, node, err)
	}
	return &HostBuffer{Bytes: b, ptr: p, node: node, own: true}, nil
}

// FreeHost releases page-locked memory.
func (c *Ctx) FreeHost(h *HostBuffer) error {
	if h == nil || h.ptr == nil {
		return nil
	}
	var err error
	if h.own {
		err = c.api.check("cuMemHostUnregister", c.api.cuMemHostUnregister(h.ptr))
		if uerr := unmapHost(h.Bytes); err == nil && uerr != nil {
			err = fmt.Errorf("unmap host buffer: %w", uerr)
		}
	} else {
		err = c.api.check("cuMemFreeHost", c.api.cuMemFreeHost(h.ptr))
	}
	h.ptr, h.Bytes = nil, nil
	return err
}

// The synchronous copies below (CopyHtoD, CopyDtoH, CopyDtoD, Upload, Download) run on the
// legacy default stream. They return when the copy is done (CopyDtoD may return earlier),
// but they do not wait for work queued on non-blocking streams: before reading what a
// stream's kernels wrote, Sync that stream. They suit loading and tests; a runner's step
// uses the Async forms on its own stream.

// CopyHtoD copies src to device address dst.
func (c *Ctx) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.api.check("cuMemcpyHtoD_v2", c.api.cuMemcpyHtoD(uintptr(dst), unsafe.Pointer(&src[0]), uint64(len(src))))
}

// CopyDtoH copies len(dst) bytes from device address src.
func (c *Ctx) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.api.check("cuMemcpyDtoH_v2", c.api.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), uintptr(src), uint64(len(dst))))
}

// CopyDtoD copies n bytes between device addresses.
func (c *Ctx) CopyDtoD(dst, src DevicePtr, n int64) error {
	return c.api.check("cuMemcpyDtoD_v2", c.api.cuMemcpyDtoD(uintptr(dst), uintptr(src), uint64(n)))
}

// CopyHtoDAsync queues a copy of src to dst on s, ordered after the work already queued on
// s and before the work queued after it. From a HostBuffer the call returns at once and
// src must stay unchanged until the stream reaches the copy (record a fence after it);
// from ordinary (pageable) memory the driver stages the bytes and the call returns once
// src has been read.
func (c *Ctx) CopyHtoDAsync(dst DevicePtr, src []byte, s *Stream) error {
	if len(src) == 0 {
		return nil
	}
	return c.api.check("cuMemcpyHtoDAsync_v2", c.api.cuMemcpyHtoDAsync(uintptr(dst), unsafe.Pointer(&src[0]), uint64(len(src)), s.handle()))
}

// CopyDtoHAsync queues a copy of len(dst) bytes from src on s. dst holds the bytes once s
// has reached the copy (Sync s, or SyncEvent a fence recorded after it); into pageable
// memory the call itself waits for the copy.
func (c *Ctx) CopyDtoHAsync(dst []byte, src DevicePtr, s *Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return c.api.check("cuMemcpyDtoHAsync_v2", c.api.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), uintptr(src), uint64(len(dst)), s.handle()))
}

// CopyDtoDAsync queues a device-to-device copy of n bytes on s.
func (c *Ctx) CopyDtoDAsync(dst, src DevicePtr, n int64, s *Stream) error {
	return c.api.check("cuMemcpyDtoDAsync_v2", c.api.cuMemcpyDtoDAsync(uintptr(dst), uintptr(src), uint64(n), s.handle()))
}

// memcpy2D is the driver's CUDA_MEMCPY2D (cuda.h): a copy of Height rows of WidthInBytes
// each, rows Pitch bytes apart at the source and at the destination.
type memcpy2D struct {
	_, _          uint64 // srcXInBytes, srcY: 0
	srcMemoryType uint32 // CUmemorytype: 2 = device
	_             uint32
	_             uintptr // srcHost
	srcDevice     uintptr
	_             uintptr // srcArray
	srcPitch      uint64
	_, _          uint64 // dstXInBytes, dstY: 0
	dstMemoryType uint32
	_             uint32
	_             uintptr // dstHost
	dstDevice     uintptr
	_             uintptr // dstArray
	dstPitch      uint64
	widthInBytes  uint64
	height        uint64
}

// CopyDtoD2DAsync queues a strided device-to-device copy on s: height rows of width bytes,
// row i from src+i·srcPitch to dst+i·dstPitch (cuMemcpy2DAsync; a memcpy node when s is
// capturing). Each pitch must be at least width.
func (c *Ctx) CopyDtoD2DAsync(dst DevicePtr, dstPitch int64, src DevicePtr, srcPitch int64, width, height int64, s *Stream) error {
	if width < 0 || height < 0 || dstPitch < width || srcPitch < width {
		return fmt.Errorf("cuda: 2D copy of %d rows of %d bytes with pitches %d (dst) and %d (src): a pitch below the width, or a negative size", height, width, dstPitch, srcPitch)
	}
	if width == 0 || height == 0 {
		return nil
	}
	const device = 2
	p := memcpy2D{
		srcMemoryType: device, srcDevice: uintptr(src), srcPitch: uint64(srcPitch),
		dstMemoryType: device, dstDevice: uintptr(dst), dstPitch: uint64(dstPitch),
		widthInBytes: uint64(width), height: uint64(height),
	}
	return c.api.check("cuMemcpy2DAsync_v2", c.api.cuMemcpy2DAsync(&p, s.handle()))
}

// UploadAsync queues a copy of a typed host slice to dst on s (see CopyHtoDAsync).
func UploadAsync[T any](c *Ctx, dst DevicePtr, src []T, s *Stream) error {
	return c.CopyHtoDAsync(dst, asBytes(src), s)
}

// DownloadAsync queues a copy of len(dst) elements from src on s (see CopyDtoHAsync).
func DownloadAsync[T any](c *Ctx, dst []T, src DevicePtr, s *Stream) error {
	return c.CopyDtoHAsync(asBytes(dst), src, s)
}

// Upload copies a typed host slice to dst.
func Upload[T any](c *Ctx, dst DevicePtr, src []T) error {
	return c.CopyHtoD(dst, asBytes(src))
}

// Download copies len(dst) elements from src into a typed host slice.
func Download[T any](c *Ctx, dst []T, src DevicePtr) error {
	return c.CopyDtoH(asBytes(dst), src)
}

// asBytes views a slice of plain values as bytes.
func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}
