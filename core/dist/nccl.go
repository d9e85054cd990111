package dist

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/resin-llm/resin/core/cudart"
)

// NCCL is a Communicator over an NCCL communicator on one device. Host buffers are staged
// through a device scratch buffer on the default stream; the GPU runners call Comm's
// device-buffer collectives directly. NCCL itself cannot say which rank failed to arrive:
// a wait past the deadline is an ErrTimeout without a rank, and it aborts the
// communicator (cudart.Comm.Abort), which ends the collective the device thread waits
// in; the communicator is unusable afterwards.
type NCCL struct {
	Comm    *cudart.Comm
	dev     *cudart.Device
	o       Options
	scratch cudart.Buffer
	broken  error
}

var _ Communicator = (*NCCL)(nil)

// NewNCCL joins rank of an NCCL communicator of size ranks named by id (rank 0 creates it
// with cudart.NewNCCLUniqueID and hands it to the others), on dev.
func NewNCCL(dev *cudart.Device, id cudart.NCCLUniqueID, size, rank int, o Options) (*NCCL, error) {
	n := &NCCL{dev: dev, o: o}
	err := n.do("join", func(c *cudart.Ctx) error {
		comm, err := cudart.InitComm(c, id, size, rank)
		n.Comm = comm
		return err
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// do runs fn on the device thread and waits for it at most the deadline.
func (n *NCCL) do(op string, fn func(c *cudart.Ctx) error) error {
	if n.broken != nil {
		return n.broken
	}
	done := make(chan error, 1)
	go func() { done <- n.dev.Do(fn) }()
	t := time.NewTimer(n.o.timeout())
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("dist: nccl %s: %w", op, err)
		}
		return nil
	case <-t.C:
		n.broken = fmt.Errorf("dist: nccl %s: %w: a rank did not arrive within %v (NCCL does not say which); the communicator is aborted", op, ErrTimeout, n.o.timeout())
		if op != "join" { // (the join sets n.Comm on the device thread)
			n.Comm.Abort()
			select { // the aborted collective returns, and the device thread with it
			case <-done:
			case <-time.After(10 * time.Second):
			}
		}
		return n.broken
	}
}

// stage makes the scratch buffer hold at least bytes (inside do).
func (n *NCCL) stage(c *cudart.Ctx, bytes int) (cudart.DevicePtr, error) {
	bytes = max(bytes, 64)
	if n.scratch.Size < int64(bytes) {
		if n.scratch.Size > 0 {
			c.Free(n.scratch)
			n.scratch = cudart.Buffer{}
		}
		b, err := c.Alloc(int64(bytes))
		if err != nil {
			return 0, err
		}
		n.scratch = b
	}
	return n.scratch.Ptr, nil
}

func ncclDType(t DType) cudart.DType {
	if t == BF16 {
		return cudart.BF16
	}
	return cudart.F32
}

func (n *NCCL) Rank() int { return n.Comm.Rank }
func (n *NCCL) Size() int { return n.Comm.Ranks }

func (n *NCCL) AllReduce(buf []byte, t DType) error {
	if err := checkElems("all-reduce", len(buf), t); err != nil {
		return err
	}
	return n.do("all-reduce", func(c *cudart.Ctx) error {
		p, err := n.stage(c, len(buf))
		if err != nil {
			return err
		}
		return firstErr(
			func() error { return c.CopyHtoD(p, buf) },
			func() error { return n.Comm.AllReduce(p, p, len(buf)/t.Size(), ncclDType(t), cudart.Sum, nil) },
			func() error { return c.CopyDtoH(buf, p) },
		)
	})
}

// gatherLens all-gathers one uint64 per rank... of each rank, a vector of k words.
func (n *NCCL) gatherWords(op string, words []uint64) ([]uint64, error) {
	k := len(words)
	out := make([]byte, 8*k*n.Size())
	in := make([]byte, 8*k)
	for i, w := range words {
		binary.LittleEndian.PutUint64(in[8*i:], w)
	}
	err := n.do(op, func(c *cudart.Ctx) error {
		p, err := n.stage(c, len(in)+len(out))
		if err != nil {
			return err
		}
		q := p.Add(int64(len(in)))
		return firstErr(
			func() error { return c.CopyHtoD(p, in) },
			func() error { return n.Comm.AllGather(p, q, len(in), cudart.Bytes, nil) },
			func() error { return c.CopyDtoH(out, q) },
		)
	})
	if err != nil {
		return nil, err
	}
	ws := make([]uint64, k*n.Size())
	for i := range ws {
		ws[i] = binary.LittleEndian.Uint64(out[8*i:])
	}
	return ws, nil
}

func (n *NCCL) AllGatherV(send []byte) ([][]byte, error) {
	lens, err := n.gatherWords("all-gather lengths", []uint64{uint64(len(send))})
	if err != nil {
		return nil, err
	}
	m := 0
	for _, l := range lens {
		m = max(m, int(l))
	}
	out := make([][]byte, n.Size())
	if m == 0 {
		for r := range out {
			out[r] = []byte{}
		}
		return out, nil
	}
	all := make([]byte, m*n.Size())
	err = n.do("all-gather", func(c *cudart.Ctx) error {
		p, err := n.stage(c, m+len(all))
		if err != nil {
			return err
		}
		q := p.Add(int64(m))
		return firstErr(
			func() error { return c.CopyHtoD(p, append(append([]byte(nil), send...), make([]byte, m-len(send))...)) },
			func() error { return n.Comm.AllGather(p, q, m, cudart.Bytes, nil) },
			func() error { return c.CopyDtoH(all, q) },
		)
	})
	if err != nil {
		return nil, err
	}
	for r := range out {
		out[r] = all[r*m : r*m+int(lens[r]) : r*m+int(lens[r])]
	}
	return out, nil
}

func (n *NCCL) ReduceScatterV(send []byte, counts []int, t DType) ([]byte, error) {
	if len(counts) != n.Size() {
		return nil, fmt.Errorf("dist: reduce-scatter: %d counts for %d ranks", len(counts), n.Size())
	}
	if err := checkElems("reduce-scatter", len(send), t); err != nil {
		return nil, err
	}
	total, m := 0, 0
	for r, c := range counts {
		if c < 0 {
			return nil, fmt.Errorf("dist: reduce-scatter: count %d for rank %d", c, r)
		}
		total += c
		m = max(m, c)
	}
	if len(send) != total*t.Size() {
		return nil, fmt.Errorf("dist: reduce-scatter: send holds %d bytes, counts sum to %d %s elements", len(send), total, t)
	}
	// NCCL scatters equal parts: each rank's part padded to the largest with zeros.
	es := t.Size()
	padded := make([]byte, m*es*n.Size())
	off := 0
	for r, c := range counts {
		copy(padded[r*m*es:], send[off*es:(off+c)*es])
		off += c
	}
	out := make([]byte, m*es)
	if m == 0 {
		return []byte{}, n.Barrier()
	}
	err := n.do("reduce-scatter", func(c *cudart.Ctx) error {
		p, err := n.stage(c, len(padded)+len(out))
		if err != nil {
			return err
		}
		q := p.Add(int64(len(padded)))
		return firstErr(
			func() error { return c.CopyHtoD(p, padded) },
			func() error { return n.Comm.ReduceScatter(p, q, m, ncclDType(t), cudart.Sum, nil) },
			func() error { return c.CopyDtoH(out, q) },
		)
	})
	if err != nil {
		return nil, err
	}
	return out[:counts[n.Rank()]*es], nil
}

// AllToAllV exchanges the lengths with an all-gather, then the parts by grouped sends and
// receives (a rank's part to itself is copied here).
func (n *NCCL) AllToAllV(send [][]byte) ([][]byte, error) {
	size, me := n.Size(), n.Rank()
	if len(send) != size {
		return nil, fmt.Errorf("dist: all-to-all: %d messages for %d ranks", len(send), size)
	}
	words := make([]uint64, size)
	for r, p := range send {
		words[r] = uint64(len(p))
	}
	lens, err := n.gatherWords("all-to-all lengths", words)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, size)
	recvTotal := 0
	for q := range size {
		out[q] = make([]byte, lens[q*size+me])
		if q != me {
			recvTotal += len(out[q])
		}
	}
	copy(out[me], send[me])
	flat := make([]byte, 0, lenAll(send))
	for q, p := range send {
		if q != me {
			flat = append(flat, p...)
		}
	}
	recv := make([]byte, recvTotal)
	err = n.do("all-to-all", func(c *cudart.Ctx) error {
		p, err := n.stage(c, len(flat)+len(recv))
		if err != nil {
			return err
		}
		rp := p.Add(int64(len(flat)))
		if err := c.CopyHtoD(p, flat); err != nil {
			return err
		}
		err = n.Comm.Group(func() error {
			so := int64(0)
			for q, part := range send {
				if q == me || len(part) == 0 {
					continue
				}
				if err := n.Comm.Send(p.Add(so), len(part), cudart.Bytes, q, nil); err != nil {
					return err
				}
				so += int64(len(part))
			}
			ro := int64(0)
			for q := range size {
				if q == me || len(out[q]) == 0 {
					continue
				}
				if err := n.Comm.Recv(rp.Add(ro), len(out[q]), cudart.Bytes, q, nil); err != nil {
					return err
				}
				ro += int64(len(out[q]))
			}
			return nil
		})
		if err != nil {
			return err
		}
		return c.CopyDtoH(recv, rp)
	})
	if err != nil {
		return nil, err
	}
	ro := 0
	for q := range size {
		if q != me {
			ro += copy(out[q], recv[ro:ro+len(out[q])])
		}
	}
	return out, nil
}

func (n *NCCL) Broadcast(buf []byte, root int) ([]byte, error) {
	if root < 0 || root >= n.Size() {
		return nil, fmt.Errorf("dist: broadcast: root %d outside [0, %d)", root, n.Size())
	}
	lens, err := n.gatherWords("broadcast length", []uint64{uint64(len(buf))})
	if err != nil {
		return nil, err
	}
	out := make([]byte, lens[root])
	if len(out) == 0 {
		return out, nil
	}
	err = n.do("broadcast", func(c *cudart.Ctx) error {
		p, err := n.stage(c, len(out))
		if err != nil {
			return err
		}
		return firstErr(
			func() error {
				if n.Rank() == root {
					return c.CopyHtoD(p, buf)
				}
				return nil
			},
			func() error { return n.Comm.Broadcast(p, p, len(out), cudart.Bytes, root, nil) },
			func() error { return c.CopyDtoH(out, p) },
		)
	})
	return out, err
}

func (n *NCCL) Barrier() error {
	return n.AllReduce(make([]byte, 4), F32)
}

// Split all-gathers the colors and keys; each new group's first rank creates its NCCL id
// and a second all-gather hands it to the members, which then join on this device.
func (n *NCCL) Split(color, key int) (Communicator, error) {
	msgs, err := n.AllGatherV(splitMessage(color, key))
	if err != nil {
		return nil, err
	}
	var members []int
	self := -1
	if color >= 0 {
		if members, self, err = splitMembers(msgs, color, n.Rank()); err != nil {
			return nil, err
		}
	}
	var mine []byte
	if self == 0 {
		id, err := cudart.NewNCCLUniqueID()
		if err != nil {
			return nil, fmt.Errorf("dist: nccl split: %w", err)
		}
		mine = id.Internal[:]
	}
	ids, err := n.AllGatherV(mine)
	if err != nil {
		return nil, err
	}
	if color < 0 {
		return nil, nil
	}
	var id cudart.NCCLUniqueID
	if len(ids[members[0]]) != len(id.Internal) {
		return nil, fmt.Errorf("dist: nccl split: rank %d sent a %d-byte id", members[0], len(ids[members[0]]))
	}
	copy(id.Internal[:], ids[members[0]])
	return NewNCCL(n.dev, id, len(members), self, n.o)
}

// Close frees the scratch buffer and the communicator. After a deadline aborted it
// (broken) the communicator is gone already; the scratch buffer is still freed once the
// device thread is free (the aborted collective has returned), waiting for it at most
// 10 s, and Close returns why the communicator broke.
func (n *NCCL) Close() error {
	free := func(c *cudart.Ctx) {
		if n.scratch.Size > 0 {
			c.Free(n.scratch)
			n.scratch = cudart.Buffer{}
		}
	}
	if n.broken != nil {
		done := make(chan error, 1)
		go func() { done <- n.dev.Do(func(c *cudart.Ctx) error { free(c); return nil }) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second): // the device thread is stuck: the buffer stays
		}
		return n.broken
	}
	return n.dev.Do(func(c *cudart.Ctx) error {
		free(c)
		return n.Comm.Destroy()
	})
}

func firstErr(fs ...func() error) error {
	for _, f := range fs {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
