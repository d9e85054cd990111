package grammar

import "fmt"

// byteSet is a set of bytes, one bit each.
type byteSet [4]uint64

func (s *byteSet) add(b byte)      { s[b>>6] |= 1 << (b & 63) }
func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }
func (s *byteSet) addRange(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s.add(byte(c))
	}
}
func (s *byteSet) empty() bool { return s[0]|s[1]|s[2]|s[3] == 0 }

// exprOp is the kind of a grammar expression node.
type exprOp uint8

const (
	opEmpty  exprOp = iota // matches the empty string
	opBytes                // one byte from set
	opSeq                  // subs in order
	opAlt                  // one of subs
	opRef                  // the rule named name
	opRepeat               // subs[0] between min and max times (max < 0: unbounded)
)

// expr is a grammar expression over bytes: what the JSON Schema, regex and GBNF front ends
// produce, and what compile turns into a program.
type expr struct {
	op       exprOp
	set      byteSet
	subs     []*expr
	name     string
	min, max int
}

func empty() *expr            { return &expr{op: opEmpty} }
func bytesOf(s byteSet) *expr { return &expr{op: opBytes, set: s} }
func ref(name string) *expr   { return &expr{op: opRef, name: name} }
func seq(subs ...*expr) *expr { return &expr{op: opSeq, subs: subs} }
func alt(subs ...*expr) *expr { return &expr{op: opAlt, subs: subs} }
func star(x *expr) *expr      { return &expr{op: opRepeat, subs: []*expr{x}, min: 0, max: -1} }
func plus(x *expr) *expr      { return &expr{op: opRepeat, subs: []*expr{x}, min: 1, max: -1} }
func opt(x *expr) *expr       { return &expr{op: opRepeat, subs: []*expr{x}, min: 0, max: 1} }
func repeat(x *expr, lo, hi int) *expr {
	return &expr{op: opRepeat, subs: []*expr{x}, min: lo, max: hi}
}

func oneByte(b byte) *expr {
	var s byteSet
	s.add(b)
	return bytesOf(s)
}

func byteRange(lo, hi byte) *expr {
	var s byteSet
	s.addRange(lo, hi)
	return bytesOf(s)
}

// lit matches the bytes of s.
func lit(s string) *expr {
	if len(s) == 1 {
		return oneByte(s[0])
	}
	x := &expr{op: opSeq, subs: make([]*expr, len(s))}
	for i := 0; i < len(s); i++ {
		x.subs[i] = oneByte(s[i])
	}
	return x
}

// grammarDef is a set of named rules; root is where matching starts.
type grammarDef struct {
	rules map[string]*expr
	order []string
	root  string
}

func newDef(root string) *grammarDef {
	return &grammarDef{rules: map[string]*expr{}, root: root}
}

func (d *grammarDef) define(name string, x *expr) {
	if _, ok := d.rules[name]; !ok {
		d.order = append(d.order, name)
	}
	d.rules[name] = x
}

// Limits bound what a grammar may compile to, so that a request's schema is refused up
// front instead of stalling a step.
const (
	maxElems     = 1 << 21 // program elements (bytes, rule references, alternative ends)
	maxRepeat    = 10000   // the largest finite bound of a repetition ({m,n}, maxItems, maxLength)
	maxRules     = 1 << 18
	maxExprNodes = 1 << 21
)

// elemKind is the kind of one program element.
type elemKind uint8

const (
	elemBytes elemKind = iota // match one byte of sets[arg]
	elemRef                   // expand rule arg
	elemEnd                   // end of an alternative
)

type elem struct {
	kind elemKind
	arg  int32
}

// program is a compiled grammar: each rule's alternatives are runs of elements ending in
// elemEnd, laid out in elems; alts[r] holds where rule r's alternatives start.
type program struct {
	elems []elem
	sets  []byteSet
	alts  [][]int32
	names []string
	root  int32
}

type compiler struct {
	def    *grammarDef
	p      *program
	ids    map[string]int32
	setIDs map[byteSet]int32
	bodies [][][]elem // per rule: alternatives, before layout
	size   int
}

// compile lays out d as a program, checking references, size and left recursion.
func compile(d *grammarDef) (*program, error) {
	c := &compiler{def: d, p: &program{}, ids: map[string]int32{}, setIDs: map[byteSet]int32{}}
	if _, ok := d.rules[d.root]; !ok {
		return nil, fmt.Errorf("grammar has no rule %q to start from", d.root)
	}
	for _, name := range d.order {
		c.ruleID(name)
	}
	for i := 0; i < len(c.p.names); i++ {
		name := c.p.names[i]
		x, ok := d.rules[name]
		if !ok {
			continue // anonymous rules are filled as they are made
		}
		alts, err := c.alternatives(x)
		if err != nil {
			return nil, err
		}
		c.bodies[i] = alts
	}
	for i, name := range c.p.names {
		if c.bodies[i] == nil {
			if _, named := d.rules[name]; !named {
				return nil, fmt.Errorf("grammar refers to undefined rule %q", name)
			}
		}
	}
	c.p.root = c.ids[d.root]
	c.layout()
	if err := c.checkLeftRecursion(); err != nil {
		return nil, err
	}
	return c.p, nil
}

func (c *compiler) ruleID(name string) int32 {
	if id, ok := c.ids[name]; ok {
		return id
	}
	id := int32(len(c.p.names))
	c.ids[name] = id
	c.p.names = append(c.p.names, name)
	c.bodies = append(c.bodies, nil)
	return id
}

func (c *compiler) anon(hint string) int32 {
	return c.ruleID(fmt.Sprintf("%s#%d", hint, len(c.p.names)))
}

func (c *compiler) grow(n int) error {
	c.size += n
	if c.size > maxElems {
		return fmt.Errorf("grammar too large: over %d elements", maxElems)
	}
	if len(c.p.names) > maxRules {
		return fmt.Errorf("grammar too large: over %d rules", maxRules)
	}
	return nil
}

func (c *compiler) setID(s byteSet) int32 {
	if id, ok := c.setIDs[s]; ok {
		return id
	}
	id := int32(len(c.p.sets))
	c.setIDs[s] = id
	c.p.sets = append(c.p.sets, s)
	return id
}

// alternatives flattens x into the alternatives of one rule.
func (c *compiler) alternatives(x *expr) ([][]elem, error) {
	var subs []*expr
	if x.op == opAlt {
		subs = x.subs
	} else {
		subs = []*expr{x}
	}
	out := make([][]elem, 0, len(subs))
	for _, s := range subs {
		var run []elem
		run, err := c.sequence(run, s)
		if err != nil {
			return nil, err
		}
		out = append(out, run)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("grammar has an empty alternation")
	}
	return out, nil
}

// sequence appends x's elements to run.
func (c *compiler) sequence(run []elem, x *expr) ([]elem, error) {
	if err := c.grow(1); err != nil {
		return nil, err
	}
	switch x.op {
	case opEmpty:
		return run, nil
	case opBytes:
		if x.set.empty() {
			return nil, fmt.Errorf("grammar has an empty character class")
		}
		return append(run, elem{elemBytes, c.setID(x.set)}), nil
	case opRef:
		return append(run, elem{elemRef, c.ruleID(x.name)}), nil
	case opSeq:
		var err error
		for _, s := range x.subs {
			if run, err = c.sequence(run, s); err != nil {
				return nil, err
			}
		}
		return run, nil
	case opAlt:
		if len(x.subs) == 1 {
			return c.sequence(run, x.subs[0])
		}
		id := c.anon("alt")
		alts, err := c.alternatives(x)
		if err != nil {
			return nil, err
		}
		c.bodies[id] = alts
		return append(run, elem{elemRef, id}), nil
	case opRepeat:
		return c.repeat(run, x)
	}
	return nil, fmt.Errorf("grammar: unknown expression %d", x.op)
}

// repeat expands x{min,max}: min copies inline, then a right-recursive rule for an
// unbounded tail or nested optional rules for a bounded one.
func (c *compiler) repeat(run []elem, x *expr) ([]elem, error) {
	lo, hi := x.min, x.max
	if lo < 0 || hi >= 0 && hi < lo {
		return nil, fmt.Errorf("grammar: bad repetition {%d,%d}", lo, hi)
	}
	if lo > maxRepeat || hi > maxRepeat {
		return nil, fmt.Errorf("grammar: repetition bound %d is over the limit %d", max(lo, hi), maxRepeat)
	}
	sub := x.subs[0]
	// One rule for the item, so that copies share it.
	item := sub
	if lo+max(hi, 1) > 2 && sub.op != opBytes && sub.op != opRef {
		id := c.anon("item")
		alts, err := c.alternatives(sub)
		if err != nil {
			return nil, err
		}
		c.bodies[id] = alts
		item = ref(c.p.names[id])
	}
	var err error
	for i := 0; i < lo; i++ {
		if run, err = c.sequence(run, item); err != nil {
			return nil, err
		}
	}
	if hi < 0 {
		// R ::= item R | ε
		id := c.anon("star")
		var body []elem
		if body, err = c.sequence(nil, item); err != nil {
			return nil, err
		}
		body = append(body, elem{elemRef, id})
		c.bodies[id] = [][]elem{body, nil}
		return append(run, elem{elemRef, id}), nil
	}
	// O_k ::= item O_{k-1} | ε, O_1 ::= item | ε
	var prev int32 = -1
	for k := 1; k <= hi-lo; k++ {
		id := c.anon("opt")
		var body []elem
		if body, err = c.sequence(nil, item); err != nil {
			return nil, err
		}
		if prev >= 0 {
			body = append(body, elem{elemRef, prev})
		}
		c.bodies[id] = [][]elem{body, nil}
		prev = id
	}
	if prev >= 0 {
		run = append(run, elem{elemRef, prev})
	}
	return run, nil
}

func (c *compiler) layout() {
	p := c.p
	p.alts = make([][]int32, len(c.bodies))
	for r, alts := range c.bodies {
		for _, run := range alts {
			p.alts[r] = append(p.alts[r], int32(len(p.elems)))
			p.elems = append(p.elems, run...)
			p.elems = append(p.elems, elem{kind: elemEnd})
		}
	}
	// A trailing sentinel so that pos+1 is always in range.
	p.elems = append(p.elems, elem{kind: elemEnd})
}

// checkLeftRecursion refuses a rule that can reach itself before consuming a byte: the
// stack-based matcher would expand it forever.
func (c *compiler) checkLeftRecursion() error {
	p := c.p
	n := len(p.alts)
	nullable := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := 0; r < n; r++ {
			if nullable[r] {
				continue
			}
			for _, start := range p.alts[r] {
				if c.runNullable(start, nullable) {
					nullable[r] = true
					changed = true
					break
				}
			}
		}
	}
	// left[r]: the rules r can expand first.
	left := make([][]int32, n)
	for r := 0; r < n; r++ {
		for _, start := range p.alts[r] {
			for pos := start; ; pos++ {
				e := p.elems[pos]
				if e.kind != elemRef {
					break
				}
				left[r] = append(left[r], e.arg)
				if !nullable[e.arg] {
					break
				}
			}
		}
	}
	const (
		white = iota
		grey
		black
	)
	color := make([]uint8, n)
	var visit func(r int32) error
	visit = func(r int32) error {
		color[r] = grey
		for _, s := range left[r] {
			switch color[s] {
			case grey:
				return fmt.Errorf("grammar rule %q is left-recursive (it can reach itself before any byte)", displayName(p.names[s]))
			case white:
				if err := visit(s); err != nil {
					return err
				}
			}
		}
		color[r] = black
		return nil
	}
	for r := 0; r < n; r++ {
		if color[r] == white {
			if err := visit(int32(r)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *compiler) runNullable(start int32, nullable []bool) bool {
	for pos := start; ; pos++ {
		e := c.p.elems[pos]
		switch e.kind {
		case elemEnd:
			return true
		case elemBytes:
			return false
		case elemRef:
			if !nullable[e.arg] {
				return false
			}
		}
	}
}

// displayName strips the #n of an anonymous rule.
func displayName(name string) string {
	for i := 0; i < len(name); i++ {
		if name[i] == '#' {
			return name[:i] + " (a group inside it)"
		}
	}
	return name
}
