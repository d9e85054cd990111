//go:build unix

package dist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The shared file: a header line, one line per rank (its pid, joined, closed and ack
// words), then two slots per rank, each a line (seq, total, chunk) and SlotBytes of data.
// A rank publishes chunk round c in slot c%2 by storing seq = c+1 after the data; before
// reusing a slot it waits until every peer's ack (rounds fully read) covers the round
// that slot held.
const (
	shmMagic = 0x52_45_53_49_4e_44_53_54 // "RESINDST"
	line     = 64
	hdrMagic = 0
	hdrRanks = 8
	hdrSlot  = 16
	rkPid    = 0
	rkJoined = 8
	rkClosed = 16
	rkAck    = 24
	slSeq    = 0
	slTotal  = 8
	slChunk  = 16
)

// ShmDir is where JoinShm puts its files: /dev/shm when it exists, else os.TempDir().
func ShmDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// JoinShm joins rank of a group of size processes on this host that meet at name (unique
// per launch, e.g. with rank 0's pid in it). Rank 0 creates the shared file and waits up
// to o.Timeout for every rank to attach, then unlinks it, so nothing is left behind; the
// others wait up to o.Timeout for it to appear.
func JoinShm(name string, rank, size int, o Options) (Communicator, error) {
	tr, err := joinShm(name, rank, size, o)
	if err != nil {
		return nil, err
	}
	return &group{tr: tr, tag: ""}, nil
}

type shmRank struct {
	name      string
	path      string
	mem       []byte
	me, n     int
	slotBytes int
	seq       uint64 // chunk rounds done
	o         Options
}

func joinShm(name string, rank, size int, o Options) (*shmRank, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("dist: shm name %q: want a non-empty name without '/'", name)
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("dist: shm %s: rank %d of %d", name, rank, size)
	}
	sb := o.SlotBytes
	if sb <= 0 {
		sb = 1 << 20
	}
	sb = (sb + line - 1) / line * line
	p := &shmRank{name: name, path: filepath.Join(ShmDir(), "resin-dist-"+name), me: rank, n: size, slotBytes: sb, o: o}
	deadline := time.Now().Add(o.joinTimeout())
	if rank == 0 {
		if err := p.create(); err != nil {
			return nil, err
		}
	} else if err := p.attach(deadline); err != nil {
		return nil, err
	}
	if rank == 0 {
		defer os.Remove(p.path)
		for r := 1; r < size; r++ {
			for atomic.LoadUint64(p.word(p.rankOff(r)+rkJoined)) == 0 {
				if o.canceled() {
					p.close()
					return nil, &PeerError{Op: "join " + name, Peer: r, Err: fmt.Errorf("%w before it joined", ErrCanceled)}
				}
				if time.Now().After(deadline) {
					p.close()
					return nil, &PeerError{Op: "join " + name, Peer: r, Err: fmt.Errorf("%w: it never joined within %v", ErrTimeout, o.joinTimeout())}
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	return p, nil
}

func (p *shmRank) fileSize() int {
	return line + p.n*line + 2*p.n*(line+p.slotBytes)
}

func (p *shmRank) rankOff(r int) int { return line + r*line }
func (p *shmRank) slotOff(r, s int) int {
	return line + p.n*line + (2*r+s)*(line+p.slotBytes)
}
func (p *shmRank) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&p.mem[off])) }

func (p *shmRank) create() error {
	os.Remove(p.path) // a previous launch's file under this name; its rank 0 is gone
	tmp := fmt.Sprintf("%s.tmp%d", p.path, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("dist: shm %s: %w", p.name, err)
	}
	defer f.Close()
	if err := f.Truncate(int64(p.fileSize())); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dist: shm %s: %w", p.name, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, p.fileSize(), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dist: shm %s: mmap: %w", p.name, err)
	}
	p.mem = mem
	*p.word(hdrRanks) = uint64(p.n)
	*p.word(hdrSlot) = uint64(p.slotBytes)
	*p.word(p.rankOff(0) + rkPid) = uint64(os.Getpid())
	atomic.StoreUint64(p.word(p.rankOff(0)+rkJoined), 1)
	atomic.StoreUint64(p.word(hdrMagic), shmMagic)
	if err := os.Rename(tmp, p.path); err != nil {
		os.Remove(tmp)
		syscall.Munmap(mem)
		return fmt.Errorf("dist: shm %s: %w", p.name, err)
	}
	return nil
}

// attach waits for rank 0's file, checks it is a live group of the expected shape, and
// claims this rank's line.
func (p *shmRank) attach(deadline time.Time) error {
	for {
		err := p.tryAttach()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errNotYet) {
			return err
		}
		if p.o.canceled() {
			return &PeerError{Op: "join " + p.name, Peer: 0, Err: fmt.Errorf("%w before rank 0 created %s", ErrCanceled, p.path)}
		}
		if time.Now().After(deadline) {
			return &PeerError{Op: "join " + p.name, Peer: 0, Err: fmt.Errorf("%w: rank 0 did not create %s within %v", ErrTimeout, p.path, p.o.joinTimeout())}
		}
		time.Sleep(time.Millisecond)
	}
}

var errNotYet = errors.New("not yet")

func (p *shmRank) tryAttach() error {
	f, err := os.OpenFile(p.path, os.O_RDWR, 0)
	if err != nil {
		return errNotYet
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() < line {
		return errNotYet
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("dist: shm %s: mmap: %w", p.name, err)
	}
	p.mem = mem
	if atomic.LoadUint64(p.word(hdrMagic)) != shmMagic {
		syscall.Munmap(mem)
		return errNotYet
	}
	n, sb := int(*p.word(hdrRanks)), int(*p.word(hdrSlot))
	if !pidAlive(int(*p.word(p.rankOff(0) + rkPid))) {
		syscall.Munmap(mem) // a dead launch's file; wait for the new rank 0's
		return errNotYet
	}
	if n != p.n {
		syscall.Munmap(mem)
		return fmt.Errorf("dist: shm %s: the group has %d ranks, this rank expected %d", p.name, n, p.n)
	}
	p.slotBytes = sb
	if int(st.Size()) != p.fileSize() {
		syscall.Munmap(mem)
		return fmt.Errorf("dist: shm %s: file of %d bytes, want %d", p.name, st.Size(), p.fileSize())
	}
	*p.word(p.rankOff(p.me) + rkPid) = uint64(os.Getpid())
	if !atomic.CompareAndSwapUint64(p.word(p.rankOff(p.me)+rkJoined), 0, 1) {
		syscall.Munmap(mem)
		return fmt.Errorf("dist: shm %s: rank %d has already joined", p.name, p.me)
	}
	return nil
}

func (p *shmRank) rank() int { return p.me }
func (p *shmRank) size() int { return p.n }

// waitFor polls cond with backoff until it holds, failing once the deadline passes or
// peer closes or exits — or any other rank does: every collective here is an exchange of
// all the ranks, which one gone can never finish, so a rank waiting on a live peer that
// waits in turn elsewhere (a TP group's all-reduce with a dead rank) fails at once too.
func (p *shmRank) waitFor(op string, peer int, deadline time.Time, cond func() bool) error {
	for i := 0; ; i++ {
		if cond() {
			return nil
		}
		switch {
		case i < 64:
			continue
		case i < 256:
			runtime.Gosched()
			continue
		}
		var gone error
		switch {
		case atomic.LoadUint64(p.word(p.rankOff(peer)+rkClosed)) != 0:
			gone = &PeerError{Op: op, Peer: peer, Err: fmt.Errorf("%w: it closed its communicator", ErrPeerGone)}
		case i%64 == 0:
			if pid := int(atomic.LoadUint64(p.word(p.rankOff(peer) + rkPid))); pid != 0 && !pidAlive(pid) {
				gone = &PeerError{Op: op, Peer: peer, Err: fmt.Errorf("%w: its process %d exited", ErrPeerGone, pid)}
			} else {
				gone = p.anyGone(op)
			}
		}
		if gone == nil && time.Now().After(deadline) {
			gone = &PeerError{Op: op, Peer: peer, Err: fmt.Errorf("%w: no answer within %v", ErrTimeout, p.o.timeout())}
		}
		if gone != nil {
			// A rank that gave what this one waits for and then closed (its last
			// collective done: a barrier before Close) or exited is not a failure: cond
			// may have come true since it was read, above.
			if cond() {
				return nil
			}
			return gone
		}
		time.Sleep(time.Duration(min(i-255, 50)) * time.Microsecond)
	}
}

func (p *shmRank) exchange(op string, send []byte) ([][]byte, error) {
	if p.mem == nil {
		return nil, fmt.Errorf("dist: %s: rank %d is closed", op, p.me)
	}
	deadline := time.Now().Add(p.o.timeout())
	out := make([][]byte, p.n)
	totals := make([]int, p.n)
	rounds := 1
	for k := 0; k < rounds; k++ {
		c := p.seq
		s := int(c % 2)
		for q := range p.n {
			if q == p.me || c < 2 {
				continue
			}
			ack := p.word(p.rankOff(q) + rkAck)
			if err := p.waitFor(op, q, deadline, func() bool { return atomic.LoadUint64(ack) >= c-1 }); err != nil {
				return nil, err
			}
		}
		lo := min(k*p.slotBytes, len(send))
		hi := min(lo+p.slotBytes, len(send))
		so := p.slotOff(p.me, s)
		copy(p.mem[so+line:], send[lo:hi])
		*p.word(so + slTotal) = uint64(len(send))
		*p.word(so + slChunk) = uint64(hi - lo)
		atomic.StoreUint64(p.word(so+slSeq), c+1)
		for q := range p.n {
			qo := p.slotOff(q, s)
			if q != p.me {
				if err := p.waitFor(op, q, deadline, func() bool { return atomic.LoadUint64(p.word(qo+slSeq)) == c+1 }); err != nil {
					return nil, err
				}
			}
			if k == 0 {
				totals[q] = int(*p.word(qo + slTotal))
				out[q] = make([]byte, 0, totals[q])
				rounds = max(rounds, (totals[q]+p.slotBytes-1)/p.slotBytes)
			}
			n := int(*p.word(qo + slChunk))
			if n > p.slotBytes || len(out[q])+n > totals[q] {
				return nil, fmt.Errorf("dist: %s: rank %d's slot is corrupt", op, q)
			}
			out[q] = append(out[q], p.mem[qo+line:qo+line+n]...)
		}
		p.seq++
		atomic.StoreUint64(p.word(p.rankOff(p.me)+rkAck), p.seq)
	}
	return out, nil
}

// anyGone is a PeerError for the first rank other than this one that closed its
// communicator or whose process exited, else nil.
func (p *shmRank) anyGone(op string) error {
	for q := range p.n {
		if q == p.me {
			continue
		}
		if atomic.LoadUint64(p.word(p.rankOff(q)+rkClosed)) != 0 {
			return &PeerError{Op: op, Peer: q, Err: fmt.Errorf("%w: it closed its communicator", ErrPeerGone)}
		}
		if pid := int(atomic.LoadUint64(p.word(p.rankOff(q) + rkPid))); pid != 0 && !pidAlive(pid) {
			return &PeerError{Op: op, Peer: q, Err: fmt.Errorf("%w: its process %d exited", ErrPeerGone, pid)}
		}
	}
	return nil
}

func (p *shmRank) sub(tag string, members []int, self int) (transport, error) {
	return joinShm(p.name+tag, self, len(members), p.o)
}

func (p *shmRank) close() error {
	if p.mem == nil {
		return nil
	}
	atomic.StoreUint64(p.word(p.rankOff(p.me)+rkClosed), 1)
	err := syscall.Munmap(p.mem)
	p.mem = nil
	return err
}

// pidAlive reports whether process pid exists and is not a zombie.
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// pid (comm) S ...: the state follows the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
			return b[i+2] != 'Z' && b[i+2] != 'X'
		}
		return true
	}
	return syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM)
}
