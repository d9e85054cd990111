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

// A grammar's shared runtime is replaced for new matchers past softStates; one that
// reaches hardStates (each state may keep a 1 KiB transition table) is left by the
// matchers that need more, which replay their output in a fresh one, and an output that
// alone reaches it fails. (Variables so that tests can lower them.)
var (
	softStates = 1 << 13
	hardStates = 1 << 16
)

const (
	maskBytes    = 4 << 20 // the masks a runtime caches, in bytes (at least minMasks masks)
	minMasks     = 16
	maxClosure   = 1 << 16 // stack nodes one closure may visit
	bottom       = -1      // the parent of a bottom stack node
	unknown      = -2      // the parent of a truncated stack node: the context is left out
	acceptNode   = 0       // node id meaning "the stack emptied": the grammar can end here
	contextNode  = 1       // node id meaning "a truncated stack popped into its unknown context"
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
	context   []bool // the state holds contextNode (a truncated state only)
	only      []bool // the state holds nothing but acceptNode or contextNode
	trans     []*[256]int32

	// Context-independent walks (see fillMask), keyed by the truncated state.
	ci      map[string]*ciResult
	ciOrder []string
	maxCI   int

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
		nodes:    []stackNode{{pos: -1, parent: bottom}, {pos: -1, parent: unknown}},
		index:    map[stackNode]int32{},
		stateKey: map[string]int32{},
		masks:    map[int32][]uint32{},
		seen:     map[stackNode]struct{}{},
		maxMasks: max(minMasks, maskBytes/(4*v.MaskWords())),
		ci:       map[string]*ciResult{},
	}
	rt.maxCI = max(minMasks/2, rt.maxMasks/2)
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
		if parent == unknown {
			rt.out = append(rt.out, contextNode)
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
	rt.out = slices.Compact(rt.out)
	set := rt.out
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
	rt.context = append(rt.context, own[0] == contextNode || len(own) > 1 && own[1] == contextNode)
	rt.only = append(rt.only, len(own) == 1 && own[0] <= contextNode)
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
		if id <= contextNode {
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
//
// Most of a mask does not depend on the stacks below the top frames of s (xgrammar's
// context-independent tokens): inside a JSON string, every token of string characters
// is allowed whatever object the string is in. So the trie is walked from the truncated
// state (each stack cut below its top keepFrames frames) once per truncated
// state, which many states share; the walk sorts every token into allowed (a path lives
// within the known frames), refused, or dependent (a path popped into the unknown
// context with bytes left), and only the dependent tokens are checked against s itself.
func (rt *runtime) fillMask(s int32, dst []uint32) error {
	if m, ok := rt.masks[s]; ok {
		copy(dst, m)
		return nil
	}
	ci, err := rt.independent(s)
	if err != nil {
		return err
	}
	copy(dst, ci.allowed)
	v := rt.v
	for _, tok := range ci.dependent {
		ns, err := rt.advance(s, v.bytes[tok])
		if err != nil {
			return err
		}
		if ns != deadState {
			dst[tok>>5] |= 1 << (tok & 31)
		}
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

// ciResult is the walk of a truncated state: the tokens allowed whatever the context,
// and those that depend on it.
type ciResult struct {
	allowed   []uint32
	dependent []int32
}

// independent returns the context-independent walk of s's truncated state.
func (rt *runtime) independent(s int32) (*ciResult, error) {
	rt.resetScratch()
	for _, id := range rt.states[s] {
		if id > contextNode {
			rt.out = append(rt.out, rt.truncate(id, keepFrames))
		}
	}
	if len(rt.out) == 0 {
		return &ciResult{allowed: make([]uint32, rt.v.MaskWords())}, nil
	}
	slices.Sort(rt.out)
	rt.out = slices.Compact(rt.out) // intern reads rt.out
	key := string(unsafe.Slice((*byte)(unsafe.Pointer(&rt.out[0])), len(rt.out)*4))
	if ci, ok := rt.ci[key]; ok {
		return ci, nil
	}
	t, err := rt.intern()
	if err != nil {
		return nil, err
	}
	ci, err := rt.walkIndependent(t)
	if err != nil {
		return nil, err
	}
	if len(rt.ciOrder) >= rt.maxCI {
		delete(rt.ci, rt.ciOrder[0])
		rt.ciOrder = rt.ciOrder[1:]
	}
	rt.ci[key] = ci
	rt.ciOrder = append(rt.ciOrder, key)
	return ci, nil
}

// keepFrames is how many top frames of a stack a truncated state keeps: enough that a
// string's or a number's characters stay within them (character class, repetition,
// the string rule, its caller), so that only the tokens leaving the value depend on the
// context. (A variable so that tests can cut stacks shorter.)
var keepFrames = 4

// truncate returns stack id cut below its top k frames (the parent there unknown).
func (rt *runtime) truncate(id int32, k int) int32 {
	nd := rt.nodes[id]
	parent := nd.parent
	switch {
	case parent == bottom:
	case k <= 1:
		parent = unknown
	default:
		parent = rt.truncate(parent, k-1)
	}
	return rt.node(nd.pos, parent)
}

// walkIndependent walks the trie from truncated state t. A subtree is skipped as soon as
// its prefix dies within the known frames, its tokens dependent when a path popped into
// the context on the way (the context may take the bytes left), refused otherwise.
func (rt *runtime) walkIndependent(t int32) (*ciResult, error) {
	v := rt.v
	ci := &ciResult{allowed: make([]uint32, v.MaskWords())}
	if cap(rt.walk) < v.maxDepth+1 {
		rt.walk = make([]int32, v.maxDepth+1)
	}
	walk := rt.walk[:v.maxDepth+1]
	popped := make([]bool, v.maxDepth+1) // popped[d]: a state at depth <= d on the path holds contextNode
	walk[0], popped[0] = t, rt.context[t]
	n := int32(len(v.label))
	label, depth, next, tokStart, toks := v.label, v.depth, v.next, v.tokStart, v.toks
	for i := int32(1); i < n; {
		d := depth[i]
		s, b := walk[d-1], label[i]
		ns := int32(unknownState)
		if tr := rt.trans[s]; tr != nil {
			ns = tr[b]
		}
		if ns == unknownState {
			var err error
			if ns, err = rt.step(s, b); err != nil {
				return nil, err
			}
		}
		if ns == deadState {
			if popped[d-1] {
				ci.dependent = append(ci.dependent, toks[tokStart[i]:tokStart[next[i]]]...)
			}
			i = next[i]
			continue
		}
		walk[d] = ns
		popped[d] = popped[d-1] || rt.context[ns]
		here := toks[tokStart[i]:tokStart[i+1]]
		if rt.only[ns] {
			// Alive only through the context (the token ends where the stack popped):
			// the context decides.
			ci.dependent = append(ci.dependent, here...)
		} else {
			for _, tok := range here {
				ci.allowed[tok>>5] |= 1 << (tok & 31)
			}
		}
		i++
	}
	return ci, nil
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
