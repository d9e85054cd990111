package cudart

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// Device is one GPU with its primary context. Every CUDA call for it runs on a single OS
// thread, locked for the device's lifetime, with the context current there: Do hands a
// function to that thread.
type Device struct {
	Info DeviceInfo

	api   *driverAPI
	dev   int32
	ctx   uintptr
	calls chan func()

	mu     sync.RWMutex // guards closed against Do
	closed bool
	wg     sync.WaitGroup
}

// OpenDevice retains the primary context of GPU ordinal and starts its thread.
func OpenDevice(ordinal int) (*Device, error) {
	api, err := loadDriver()
	if err != nil {
		return nil, err
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("open device %d: %w: the driver sees %d GPUs", ordinal, ErrNoCUDA, n)
	}
	info, err := deviceInfo(ordinal)
	if err != nil {
		return nil, err
	}
	d := &Device{Info: info, api: api, calls: make(chan func())}
	started := make(chan error, 1)
	d.wg.Add(1)
	go d.loop(ordinal, started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("open device %d: %w", ordinal, err)
	}
	openDevices.add(d)
	return d, nil
}

// openDevices lists the devices whose threads are running, so that a NUMA binding made
// after a device opened reaches its thread's memory policy too.
var openDevices deviceSet

type deviceSet struct {
	mu sync.Mutex
	m  map[*Device]struct{}
}

func (s *deviceSet) add(d *Device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*Device]struct{}{}
	}
	s.m[d] = struct{}{}
}

func (s *deviceSet) remove(d *Device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, d)
}

func (s *deviceSet) list() []*Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Device, 0, len(s.m))
	for d := range s.m {
		out = append(out, d)
	}
	return out
}

// applyPreferredToOpenDevices gives every open device's thread the process's preferred
// node (set by BindNode or BindNUMA). It must not run inside Do.
func applyPreferredToOpenDevices() error {
	for _, d := range openDevices.list() {
		if err := d.Do(func(*Ctx) error { return applyPreferredNode() }); err != nil && !errors.Is(err, ErrClosed) {
			return fmt.Errorf("device %d thread: %w", d.Info.Ordinal, err)
		}
	}
	return nil
}

// loop is the device's thread: it makes the primary context current once, then runs the
// calls handed to it until Close.
func (d *Device) loop(ordinal int, started chan<- error) {
	defer d.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	api := d.api
	if err := api.check("cuDeviceGet", api.cuDeviceGet(&d.dev, int32(ordinal))); err != nil {
		started <- err
		return
	}
	if err := api.check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		started <- err
		return
	}
	if err := api.check("cuCtxSetCurrent", api.cuCtxSetCurrent(d.ctx)); err != nil {
		api.cuDevicePrimaryCtxRelease(d.dev)
		started <- err
		return
	}
	if err := applyPreferredNode(); err != nil {
		api.cuDevicePrimaryCtxRelease(d.dev)
		started <- err
		return
	}
	started <- nil
	for fn := range d.calls {
		fn()
	}
	api.cuCtxSynchronize()
	api.cuDevicePrimaryCtxRelease(d.dev)
}

// Do runs fn on the device's thread and returns its error. Calls made through the Ctx are
// valid only inside fn; fn must not call Do itself. Group many calls (a step's launches)
// into one Do: each Do costs a hand-over between threads.
func (d *Device) Do(fn func(c *Ctx) error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return fmt.Errorf("device %d: %w", d.Info.Ordinal, ErrClosed)
	}
	var err error
	done := make(chan struct{})
	d.calls <- func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("device %d: call panicked: %v", d.Info.Ordinal, p)
			}
		}()
		err = fn(&Ctx{dev: d, api: d.api})
	}
	<-done
	return err
}

// Close waits for pending work, releases the primary context and stops the thread.
// Buffers, modules and streams should be released first.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.calls)
	d.mu.Unlock()
	openDevices.remove(d)
	d.wg.Wait()
	return nil
}

// MemInfo returns the free and total device memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	err = d.Do(func(c *Ctx) error {
		var f, t uint64
		if err := c.api.check("cuMemGetInfo_v2", c.api.cuMemGetInfo(&f, &t)); err != nil {
			return err
		}
		free, total = int64(f), int64(t)
		return nil
	})
	return free, total, err
}

// Ctx is the handle to a device's context inside Device.Do. Its methods make CUDA calls
// directly on the device's thread.
type Ctx struct {
	dev *Device
	api *driverAPI
}

// Device returns the device this context belongs to.
func (c *Ctx) Device() *Device { return c.dev }

// Synchronize waits for all work on the device.
func (c *Ctx) Synchronize() error {
	return c.api.check("cuCtxSynchronize", c.api.cuCtxSynchronize())
}
