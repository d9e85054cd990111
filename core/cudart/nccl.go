package cudart

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// NCCLUniqueID identifies a communicator; rank 0 creates it and sends it to the others.
type NCCLUniqueID struct{ Internal [128]byte }

type ncclAPI struct {
	ncclGetVersion     func(v *int32) int32
	ncclGetUniqueId    func(id *NCCLUniqueID) int32
	ncclCommInitRank   func(comm *uintptr, nranks int32, id NCCLUniqueID, rank int32) int32
	ncclCommDestroy    func(comm uintptr) int32
	ncclCommAbort      func(comm uintptr) int32
	ncclAllReduce      func(send, recv uintptr, count uint64, dtype, op int32, comm, stream uintptr) int32
	ncclAllGather      func(send, recv uintptr, count uint64, dtype int32, comm, stream uintptr) int32
	ncclReduceScatter  func(send, recv uintptr, count uint64, dtype, op int32, comm, stream uintptr) int32
	ncclBroadcast      func(send, recv uintptr, count uint64, dtype, root int32, comm, stream uintptr) int32
	ncclSend           func(send uintptr, count uint64, dtype, peer int32, comm, stream uintptr) int32
	ncclRecv           func(recv uintptr, count uint64, dtype, peer int32, comm, stream uintptr) int32
	ncclGroupStart     func() int32
	ncclGroupEnd       func() int32
	ncclGetErrorString func(r int32) string
}

var (
	ncclLib = &library{name: "nccl", sentinel: ErrNoNCCL,
		names: []string{"libnccl.so.2", "libnccl.so"},
		dirs:  append(append([]string{}, cudaDirs...), pythonLibDirs("nccl")...)}
	ncclOnce sync.Once
	nccl     *ncclAPI
	ncclErr  error
)

func loadNCCL() (*ncclAPI, error) {
	ncclOnce.Do(func() {
		a := &ncclAPI{}
		_, err := ncclLib.bindAll([]binding{
			{&a.ncclGetVersion, "ncclGetVersion"},
			{&a.ncclGetUniqueId, "ncclGetUniqueId"},
			{&a.ncclCommInitRank, "ncclCommInitRank"},
			{&a.ncclCommDestroy, "ncclCommDestroy"},
			{&a.ncclCommAbort, "ncclCommAbort"},
			{&a.ncclAllReduce, "ncclAllReduce"},
			{&a.ncclAllGather, "ncclAllGather"},
			{&a.ncclReduceScatter, "ncclReduceScatter"},
			{&a.ncclBroadcast, "ncclBroadcast"},
			{&a.ncclSend, "ncclSend"},
			{&a.ncclRecv, "ncclRecv"},
			{&a.ncclGroupStart, "ncclGroupStart"},
			{&a.ncclGroupEnd, "ncclGroupEnd"},
		})
		if err != nil {
			ncclErr = err
			return
		}
		p, err := ncclLib.sym("ncclGetErrorString")
		if err != nil {
			ncclErr = err
			return
		}
		bindString(&a.ncclGetErrorString, p)
		nccl = a
	})
	return nccl, ncclErr
}

func (a *ncclAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	if r == codeMissing {
		return fmt.Errorf("nccl: %s: %w", call, ErrMissingSymbol)
	}
	return &Error{Lib: "nccl", Call: call, Code: int(r), Msg: a.ncclGetErrorString(r)}
}

// NCCLVersion returns NCCL's version code, e.g. 22105 for 2.21.5.
func NCCLVersion() (int, error) {
	a, err := loadNCCL()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := a.check("ncclGetVersion", a.ncclGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NewNCCLUniqueID creates the id rank 0 shares with the other ranks.
func NewNCCLUniqueID() (NCCLUniqueID, error) {
	var id NCCLUniqueID
	a, err := loadNCCL()
	if err != nil {
		return id, err
	}
	return id, a.check("ncclGetUniqueId", a.ncclGetUniqueId(&id))
}

// ReduceOp is an NCCL reduction.
type ReduceOp int32

// NCCL reductions.
const (
	Sum ReduceOp = 0
	Max ReduceOp = 2
	Min ReduceOp = 3
	Avg ReduceOp = 4
)

// ncclType is the ncclDataType_t: ncclFloat32, ncclBfloat16, ncclFloat16; -1 (which NCCL
// rejects as an invalid argument) for an unknown type.
func ncclType(t DType) int32 {
	if t == Bytes {
		return 1
	}
	if !t.valid() {
		return -1
	}
	return [...]int32{7, 9, 6}[t]
}

// ErrAborted is the error of a call on a communicator after Abort.
var ErrAborted = errors.New("nccl: the communicator was aborted")

// Comm is one rank of an NCCL communicator, bound to a device.
type Comm struct {
	api     *ncclAPI
	h       uintptr
	aborted atomic.Bool
	// end serialises Destroy and Abort: each frees the communicator, so only one may.
	end   sync.Mutex
	Rank  int
	Ranks int
}

// InitComm joins rank of a communicator of ranks processes or devices; it must run inside
// Device.Do of the rank's device, and every rank must call it (it blocks until all join).
// Several ranks in one process call it concurrently, each from its own device's Do.
func InitComm(c *Ctx, id NCCLUniqueID, ranks, rank int) (*Comm, error) {
	a, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	if rank < 0 || rank >= ranks {
		return nil, fmt.Errorf("nccl: rank %d outside [0, %d)", rank, ranks)
	}
	comm := &Comm{api: a, Rank: rank, Ranks: ranks}
	if err := a.check("ncclCommInitRank", a.ncclCommInitRank(&comm.h, int32(ranks), id, int32(rank))); err != nil {
		return nil, fmt.Errorf("nccl rank %d of %d: %w", rank, ranks, err)
	}
	return comm, nil
}

// call is check of the NCCL call r makes on m, unless m was aborted (ErrAborted).
func (m *Comm) call(name string, r func() int32) error {
	if m.aborted.Load() {
		return fmt.Errorf("%s: %w", name, ErrAborted)
	}
	return m.api.check(name, r())
}

// AllReduce reduces count elements of send across ranks into recv (which may equal send).
func (m *Comm) AllReduce(send, recv DevicePtr, count int, t DType, op ReduceOp, s *Stream) error {
	return m.call("ncclAllReduce", func() int32 {
		return m.api.ncclAllReduce(uintptr(send), uintptr(recv), uint64(count), ncclType(t), int32(op), m.h, s.handle())
	})
}

// AllGather gathers count elements from each rank into recv (Ranks*count elements).
func (m *Comm) AllGather(send, recv DevicePtr, count int, t DType, s *Stream) error {
	return m.call("ncclAllGather", func() int32 {
		return m.api.ncclAllGather(uintptr(send), uintptr(recv), uint64(count), ncclType(t), m.h, s.handle())
	})
}

// ReduceScatter reduces Ranks*count elements of send and leaves this rank's count in recv.
func (m *Comm) ReduceScatter(send, recv DevicePtr, count int, t DType, op ReduceOp, s *Stream) error {
	return m.call("ncclReduceScatter", func() int32 {
		return m.api.ncclReduceScatter(uintptr(send), uintptr(recv), uint64(count), ncclType(t), int32(op), m.h, s.handle())
	})
}

// Broadcast copies count elements of root's send into every rank's recv (which may equal
// send); only root's send is read.
func (m *Comm) Broadcast(send, recv DevicePtr, count int, t DType, root int, s *Stream) error {
	if root < 0 || root >= m.Ranks {
		return fmt.Errorf("nccl: broadcast root %d outside [0, %d)", root, m.Ranks)
	}
	return m.call("ncclBroadcast", func() int32 {
		return m.api.ncclBroadcast(uintptr(send), uintptr(recv), uint64(count), ncclType(t), int32(root), m.h, s.handle())
	})
}

// Bytes is the element type for moving raw bytes (Broadcast, Send, Recv, AllGather): NCCL's
// ncclUint8. It cannot be reduced.
const Bytes DType = 100

// Send queues count elements to peer; pair it with the peer's Recv inside a group.
func (m *Comm) Send(buf DevicePtr, count int, t DType, peer int, s *Stream) error {
	return m.call("ncclSend", func() int32 {
		return m.api.ncclSend(uintptr(buf), uint64(count), ncclType(t), int32(peer), m.h, s.handle())
	})
}

// Recv queues the receipt of count elements from peer.
func (m *Comm) Recv(buf DevicePtr, count int, t DType, peer int, s *Stream) error {
	return m.call("ncclRecv", func() int32 {
		return m.api.ncclRecv(uintptr(buf), uint64(count), ncclType(t), int32(peer), m.h, s.handle())
	})
}

// Group runs fn between ncclGroupStart and ncclGroupEnd, so the sends and receives it
// queues proceed together.
func (m *Comm) Group(fn func() error) error {
	if err := m.api.check("ncclGroupStart", m.api.ncclGroupStart()); err != nil {
		return err
	}
	ferr := fn()
	if err := m.api.check("ncclGroupEnd", m.api.ncclGroupEnd()); err != nil && ferr == nil {
		ferr = err
	}
	return ferr
}

// Destroy frees the communicator; after Abort it does nothing.
func (m *Comm) Destroy() error {
	m.end.Lock()
	defer m.end.Unlock()
	if m.h == 0 || m.aborted.Load() {
		return nil
	}
	err := m.api.check("ncclCommDestroy", m.api.ncclCommDestroy(m.h))
	m.h = 0
	return err
}

// Abort ends the communicator (ncclCommAbort) from any goroutine, while another may be
// waiting on a stream whose collective will never complete (a peer died or hangs: NCCL's
// collectives have no deadline): NCCL stops the rank's queued collectives, so the wait
// returns. What they left in their buffers is undefined: a step that Abort ended has
// failed, whatever its stream says (gpurunner.Watchdog). Every later call on m fails with
// ErrAborted, and Destroy does nothing (the abort freed it). Abort is idempotent.
func (m *Comm) Abort() error {
	if m == nil {
		return nil
	}
	m.end.Lock()
	defer m.end.Unlock()
	if m.h == 0 || m.aborted.Swap(true) {
		return nil // destroyed already, or aborted
	}
	return m.api.check("ncclCommAbort", m.api.ncclCommAbort(m.h))
}

// Aborted reports whether Abort was called.
func (m *Comm) Aborted() bool { return m != nil && m.aborted.Load() }
