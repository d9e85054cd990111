package grammar

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

// The matcher is a pushdown automaton over bytes, run as a lazily built DFA: a parser
// state is the set of stacks whose top element is a byte to match (interned, so a state
// is an id), and each state's transition on each byte is computed once and kept. A mask
// is a walk of the vocabulary's token trie from a state, pruning a subtree as soon as its
// prefix dies; the mask of each state is cached too. Since the stacks of a JSON string,
// number or whitespace run repeat from byte to byte, most steps are a cache hit.

// ErrStateLimit is returned when one request's grammar reaches more parser states than a
// matcher keeps.
var ErrStateLimit = errors.New("grammar: the output reached more parser states than the limit")

const (
	softStates   = 1 << 13 // a grammar's shared runtime is replaced for new matchers past this
	hardStates   = 1 << 16 // a matcher whose runtime grows past this fails (each state may keep a 1 KiB transition table)
	maskBytes    = 4 << 20 // the masks a runtime caches, in bytes (at least minMasks masks)
	minMasks     = 16
	maxClosure   = 1 << 16 // stack nodes one closure may visit
	bottom       = -1      // the parent of a bottom stack node
	acceptNode   = 0       // node id meaning "the stack emptied": the grammar can end here
	deadState    = -1
	unknownState = -2
)

type stackNode struct {
	pos    int32 // the element to match next
	parent int32 // the node below, or bottom
}

// runtime holds the interned stacks, states, transitions and masks of one program
// against one vocabulary. Its methods lock mu.
type runtime struct {
	mu    sync.Mutex
	p     *program
	v     *Vocabulary
	nodes []stackNode
	index map[stackNode]int32

	states    [][]int32 // sorted node ids
	stateKey  map[string]int32
	accepting []bool
	trans     []*[256]int32

	masks     map[int32][]uint32
	maskOrder []int32
	maxMasks  int

	// scratch
	seen    map[stackNode]struct{}
	out     []int32
	visited int
	walk    []int32
}

func newRuntime(p *program, v *Vocabulary) *runtime {
	rt := &runtime{
		p: p, v: v,
		nodes:    []stackNode{{pos: -1, parent: bottom}},
		index:    map[stackNode]int32{},
		stateKey: map[string]int32{},
		masks:    map[int32][]uint32{},
		seen:     map[stackNode]struct{}{},
		maxMasks: max(minMasks, maskBytes/(4*v.MaskWords())),
	}
	return rt
}

func (rt *runtime) node(pos, parent int32) int32 {
	k := stackNode{pos, parent}
	if id, ok := rt.index[k]; ok {
		return id
	}
	id := int32(len(rt.nodes))
	rt.nodes = append(rt.nodes, k)
	rt.index[k] = id
	return id
}

// closure adds to rt.out the ready stacks reached from the stack (pos, parent) without
// consuming a byte.
func (rt *runtime) closure(pos, parent int32) error {
	k := stackNode{pos, parent}
	if _, ok := rt.seen[k]; ok {
		return nil
	}
	rt.seen[k] = struct{}{}
	if rt.visited++; rt.visited > maxClosure {
		return fmt.Errorf("grammar: one step expands more than %d parser stacks", maxClosure)
	}
	e := rt.p.elems[pos]
	switch e.kind {
	case elemBytes:
		rt.out = append(rt.out, rt.node(pos, parent))
	case elemEnd:
		if parent == bottom {
			rt.out = append(rt.out, acceptNode)
			return nil
		}
		pn := rt.nodes[parent]
		return rt.closure(pn.pos, pn.parent)
	case elemRef:
		below := parent
		if rt.p.elems[pos+1].kind != elemEnd {
			below = rt.node(pos+1, parent)
		} // else a tail call: the callee returns straight to parent, so repetition
		// by right recursion does not grow the stack.
		for _, start := range rt.p.alts[e.arg] {
			if err := rt.closure(start, below); err != nil {
				return err
			}
		}
	}
	return nil
}

func (rt *runtime) resetScratch() {
	clear(rt.seen)
	rt.out = rt.out[:0]
	rt.visited = 0
}

// intern returns the state of the node set in rt.out.
func (rt *runtime) intern() (int32, error) {
	if len(rt.out) == 0 {
		return deadState, nil
	}
	slices.Sort(rt.out)
	set := slices.Compact(rt.out)
	key := unsafe.String((*byte)(unsafe.Pointer(&set[0])), len(set)*4)
	if id, ok := rt.stateKey[key]; ok {
		return id, nil
	}
	if len(rt.states) >= hardStates {
		return deadState, ErrStateLimit
	}
	id := int32(len(rt.states))
	own := slices.Clone(set)
	rt.states = append(rt.states, own)
	rt.stateKey[string(unsafe.String((*byte)(unsafe.Pointer(&own[0])), len(own)*4))] = id
	acc := own[0] == acceptNode
	rt.accepting = append(rt.accepting, acc)
	rt.trans = append(rt.trans, nil)
	return id, nil
}

// start returns the initial state.
func (rt *runtime) start() (int32, error) {
	rt.resetScratch()
	for _, s := range rt.p.alts[rt.p.root] {
		if err := rt.closure(s, bottom); err != nil {
			return deadState, err
		}
	}
	return rt.intern()
}

// step returns the state after byte b from state s, or deadState.
func (rt *runtime) step(s int32, b byte) (int32, error) {
	t := rt.trans[s]
	if t == nil {
		t = new([256]int32)
		for i := range t {
			t[i] = unknownState
		}
		rt.trans[s] = t
	}
	if n := t[b]; n != unknownState {
		return n, nil
	}
	rt.resetScratch()
	for _, id := range rt.states[s] {
		if id == acceptNode {
			continue
		}
		nd := rt.nodes[id]
		e := rt.p.elems[nd.pos]
		if !rt.p.sets[e.arg].has(b) {
			continue
		}
		if err := rt.closure(nd.pos+1, nd.parent); err != nil {
			return deadState, err
		}
	}
	n, err := rt.intern()
	if err != nil {
		return deadState, err
	}
	t[b] = n
	return n, nil
}

// fillMask writes the allowed tokens of state s into dst (MaskWords words).
func (rt *runtime) fillMask(s int32, dst []uint32) error {
	if m, ok := rt.masks[s]; ok {
		copy(dst, m)
		return nil
	}
	clear(dst)
	v := rt.v
	if cap(rt.walk) < v.maxDepth+1 {
		rt.walk = make([]int32, v.maxDepth+1)
	}
	walk := rt.walk[:v.maxDepth+1]
	walk[0] = s
	n := int32(len(v.label))
	label, depth, next, tokStart, toks := v.label, v.depth, v.next, v.tokStart, v.toks
	for i := int32(1); i < n; {
		d := depth[i]
		s, b := walk[d-1], label[i]
		ns := int32(unknownState)
		if t := rt.trans[s]; t != nil {
			ns = t[b]
		}
		if ns == unknownState {
			var err error
			if ns, err = rt.step(s, b); err != nil {
				return err
			}
		}
		if ns == deadState {
			i = next[i]
			continue
		}
		walk[d] = ns
		for _, tok := range toks[tokStart[i]:tokStart[i+1]] {
			dst[tok>>5] |= 1 << (tok & 31)
		}
		i++
	}
	if rt.accepting[s] {
		for _, tok := range v.eos {
			dst[tok>>5] |= 1 << (tok & 31)
		}
	}
	if len(rt.maskOrder) >= rt.maxMasks {
		old := rt.maskOrder[0]
		rt.maskOrder = rt.maskOrder[1:]
		delete(rt.masks, old)
	}
	rt.masks[s] = slices.Clone(dst)
	rt.maskOrder = append(rt.maskOrder, s)
	return nil
}

// advance returns the state after the bytes of a token from s, or deadState.
func (rt *runtime) advance(s int32, b []byte) (int32, error) {
	var err error
	for _, c := range b {
		if s, err = rt.step(s, c); err != nil || s == deadState {
			return deadState, err
		}
	}
	return s, nil
}

func (rt *runtime) size() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.states)
}
