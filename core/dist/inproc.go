package dist

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// NewInProcess returns the n ranks of one group whose members are goroutines of this
// process: rank r is the r-th communicator, to be used by one goroutine each.
func NewInProcess(n int, o Options) ([]Communicator, error) {
	if n < 1 {
		return nil, fmt.Errorf("dist: in-process group of %d ranks", n)
	}
	w := &inprocWorld{subs: map[string]*inprocShared{}}
	sh := newInprocShared(n)
	out := make([]Communicator, n)
	for r := range n {
		out[r] = &group{tr: &inprocRank{w: w, sh: sh, me: r, timeout: o.timeout()}, tag: "w"}
	}
	return out, nil
}

// inprocWorld holds the subgroups Split creates, by tag, so that their members meet.
type inprocWorld struct {
	mu   sync.Mutex
	subs map[string]*inprocShared
}

// inprocShared is one group's state: the rounds under way and which ranks have closed.
type inprocShared struct {
	n      int
	mu     sync.Mutex
	rounds map[uint64]*inprocRound
	closed []bool
	gone   chan struct{} // closed (and replaced) whenever a rank closes
}

type inprocRound struct {
	msgs    [][]byte
	posted  []bool
	arrived int
	read    int
	done    chan struct{}
}

func newInprocShared(n int) *inprocShared {
	return &inprocShared{n: n, rounds: map[uint64]*inprocRound{}, closed: make([]bool, n), gone: make(chan struct{})}
}

type inprocRank struct {
	w       *inprocWorld
	sh      *inprocShared
	me      int
	seq     uint64
	timeout time.Duration
}

func (p *inprocRank) rank() int { return p.me }
func (p *inprocRank) size() int { return p.sh.n }

func (p *inprocRank) exchange(op string, send []byte) ([][]byte, error) {
	sh := p.sh
	seq := p.seq
	p.seq++
	sh.mu.Lock()
	if sh.closed[p.me] {
		sh.mu.Unlock()
		return nil, fmt.Errorf("dist: %s: rank %d is closed", op, p.me)
	}
	rd := sh.rounds[seq]
	if rd == nil {
		rd = &inprocRound{msgs: make([][]byte, sh.n), posted: make([]bool, sh.n), done: make(chan struct{})}
		sh.rounds[seq] = rd
	}
	rd.msgs[p.me] = append([]byte(nil), send...)
	rd.posted[p.me] = true
	if rd.arrived++; rd.arrived == sh.n {
		close(rd.done)
	}
	sh.mu.Unlock()
	deadline := time.NewTimer(p.timeout)
	defer deadline.Stop()
	for {
		sh.mu.Lock()
		gone := sh.gone
		missing := -1
		for r := range sh.n {
			if sh.closed[r] && !rd.posted[r] {
				missing = r
				break
			}
		}
		sh.mu.Unlock()
		if missing >= 0 {
			return nil, &PeerError{Op: op, Peer: missing, Err: fmt.Errorf("%w: it closed before this round", ErrPeerGone)}
		}
		select {
		case <-rd.done:
			sh.mu.Lock()
			out := rd.msgs // read-only from here on: every rank reads the same messages
			if rd.read++; rd.read == sh.n {
				delete(sh.rounds, seq)
			}
			sh.mu.Unlock()
			return out, nil
		case <-gone:
		case <-deadline.C:
			sh.mu.Lock()
			var ms []string
			first := -1
			for r, ok := range rd.posted {
				if !ok {
					ms = append(ms, fmt.Sprint(r))
					if first < 0 {
						first = r
					}
				}
			}
			sh.mu.Unlock()
			if first < 0 { // everyone arrived as the timer fired
				continue
			}
			return nil, &PeerError{Op: op, Peer: first, Err: fmt.Errorf("%w: ranks %s did not arrive within %v", ErrTimeout, strings.Join(ms, ", "), p.timeout)}
		}
	}
}

func (p *inprocRank) sub(tag string, members []int, self int) (transport, error) {
	p.w.mu.Lock()
	sh := p.w.subs[tag]
	if sh == nil {
		sh = newInprocShared(len(members))
		p.w.subs[tag] = sh
	}
	p.w.mu.Unlock()
	return &inprocRank{w: p.w, sh: sh, me: self, timeout: p.timeout}, nil
}

func (p *inprocRank) close() error {
	p.sh.mu.Lock()
	defer p.sh.mu.Unlock()
	if !p.sh.closed[p.me] {
		p.sh.closed[p.me] = true
		close(p.sh.gone)
		p.sh.gone = make(chan struct{})
	}
	return nil
}
