package grammar

import (
	"errors"
	"fmt"
	"sync"
)

// Grammar is a compiled grammar bound to a vocabulary. It is safe for concurrent use;
// each request gets its own Matcher from NewMatcher.
type Grammar struct {
	kind   Kind
	prog   *program
	vocab  *Vocabulary
	mu     sync.Mutex
	shared *runtime
}

func newGrammar(kind Kind, p *program, v *Vocabulary) (*Grammar, error) {
	g := &Grammar{kind: kind, prog: p, vocab: v, shared: newRuntime(p, v)}
	// The start state, so that a grammar that matches nothing is refused at compile.
	g.shared.mu.Lock()
	s, err := g.shared.start()
	g.shared.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if s == deadState {
		return nil, fmt.Errorf("grammar matches nothing")
	}
	return g, nil
}

// Kind is the grammar's form.
func (g *Grammar) Kind() Kind { return g.kind }

// Vocabulary is the vocabulary g was compiled against.
func (g *Grammar) Vocabulary() *Vocabulary { return g.vocab }

// NewMatcher starts matching g from its beginning.
func (g *Grammar) NewMatcher() (*Matcher, error) {
	g.mu.Lock()
	rt := g.shared
	if rt.size() > softStates {
		// Old matchers keep the old runtime; new ones start afresh, so a long-lived
		// grammar (json_object) does not grow without bound.
		rt = newRuntime(g.prog, g.vocab)
		g.shared = rt
	}
	g.mu.Unlock()
	rt.mu.Lock()
	s, err := rt.start()
	rt.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &Matcher{g: g, rt: rt, hist: []int32{s}}, nil
}

// fresh returns a runtime to replace old, which reached its state limit: the grammar's
// new shared one (made now unless another matcher already left old).
func (g *Grammar) fresh(old *runtime) *runtime {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shared == old {
		g.shared = newRuntime(g.prog, g.vocab)
	}
	return g.shared
}

// migrate moves m to a fresh runtime after its shared one reached the state limit,
// replaying the tokens it accepted. It fails with ErrStateLimit when the output alone
// reaches the limit.
func (m *Matcher) migrate() error {
	rt := m.g.fresh(m.rt)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	s, err := rt.start()
	if err != nil {
		return err
	}
	hist := make([]int32, 1, len(m.hist))
	hist[0] = s
	for _, tok := range m.toks {
		if m.g.vocab.isEOS[tok] {
			hist = append(hist, eosState)
			continue
		}
		if s, err = rt.advance(s, m.tokenBytes(tok)); err != nil {
			return err
		}
		if s == deadState {
			return fmt.Errorf("grammar: replaying the output in a fresh runtime refused token %d", tok)
		}
		hist = append(hist, s)
	}
	m.rt, m.hist = rt, hist
	return nil
}

// retry runs f, and once more on a fresh runtime when m's reached the state limit.
func (m *Matcher) retry(f func() error) error {
	err := f()
	if errors.Is(err, ErrStateLimit) {
		if merr := m.migrate(); merr != nil {
			return merr
		}
		err = f()
	}
	return err
}

// Matcher follows one output through a grammar: Mask says which tokens may come next,
// Accept takes the token sampled, Rollback undoes accepted tokens (rejected speculative
// drafts). It is not safe for concurrent use.
type Matcher struct {
	g    *Grammar
	rt   *runtime
	hist []int32 // the state before each accepted token, then the current one; eosState once ended
	toks []int32 // the tokens accepted (for a replay in a fresh runtime)
}

// eosState marks a matcher that accepted EOS.
const eosState = -3

// Words is the length of the masks FillMask writes.
func (m *Matcher) Words() int { return m.g.vocab.MaskWords() }

// FillMask writes the tokens allowed next into mask (Words() words, bit i%32 of word i/32
// for token i). Once the output ended (EOS accepted) nothing is allowed.
func (m *Matcher) FillMask(mask []uint32) error {
	if len(mask) < m.Words() {
		return fmt.Errorf("grammar: mask of %d words for a vocabulary of %d tokens", len(mask), m.g.vocab.size)
	}
	mask = mask[:m.Words()]
	s := m.hist[len(m.hist)-1]
	if s == eosState {
		clear(mask)
		return nil
	}
	return m.retry(func() error {
		m.rt.mu.Lock()
		defer m.rt.mu.Unlock()
		return m.rt.fillMask(m.hist[len(m.hist)-1], mask)
	})
}

// Allowed reports whether tok may come next.
func (m *Matcher) Allowed(tok int32) bool {
	s := m.hist[len(m.hist)-1]
	if s == eosState || tok < 0 || int(tok) >= m.g.vocab.size {
		return false
	}
	v := m.g.vocab
	m.rt.mu.Lock()
	defer m.rt.mu.Unlock()
	if v.isEOS[tok] {
		return m.rt.accepting[s]
	}
	b := m.tokenBytes(tok)
	if b == nil {
		return false
	}
	ns, err := m.rt.advance(s, b)
	return err == nil && ns != deadState
}

// Accept advances past tok, which must be allowed; EOS ends the output.
func (m *Matcher) Accept(tok int32) error {
	s := m.hist[len(m.hist)-1]
	if s == eosState {
		return fmt.Errorf("grammar: token %d after the output ended", tok)
	}
	v := m.g.vocab
	if tok < 0 || int(tok) >= v.size {
		return fmt.Errorf("grammar: token %d outside the vocabulary of %d", tok, v.size)
	}
	if v.isEOS[tok] {
		m.rt.mu.Lock()
		ok := m.rt.accepting[s]
		m.rt.mu.Unlock()
		if !ok {
			return fmt.Errorf("grammar: EOS (token %d) where the grammar cannot end", tok)
		}
		m.hist, m.toks = append(m.hist, eosState), append(m.toks, tok)
		return nil
	}
	b := m.tokenBytes(tok)
	if b == nil {
		return fmt.Errorf("grammar: token %d is special and never allowed", tok)
	}
	var ns int32
	err := m.retry(func() error {
		m.rt.mu.Lock()
		defer m.rt.mu.Unlock()
		var err error
		ns, err = m.rt.advance(m.hist[len(m.hist)-1], b)
		return err
	})
	if err != nil {
		return err
	}
	if ns == deadState {
		return fmt.Errorf("grammar: token %d (%q) is not allowed here", tok, b)
	}
	m.hist, m.toks = append(m.hist, ns), append(m.toks, tok)
	return nil
}

// Rollback undoes the last n accepted tokens.
func (m *Matcher) Rollback(n int) error {
	if n < 0 || n > len(m.hist)-1 {
		return fmt.Errorf("grammar: rollback of %d tokens, %d accepted", n, len(m.hist)-1)
	}
	m.hist, m.toks = m.hist[:len(m.hist)-n], m.toks[:len(m.toks)-n]
	return nil
}

// Accepted is the number of tokens accepted (EOS included).
func (m *Matcher) Accepted() int { return len(m.hist) - 1 }

// Ended reports whether EOS was accepted.
func (m *Matcher) Ended() bool { return m.hist[len(m.hist)-1] == eosState }

// CanEnd reports whether the output so far is complete: EOS is allowed now (or was
// accepted).
func (m *Matcher) CanEnd() bool {
	s := m.hist[len(m.hist)-1]
	if s == eosState {
		return true
	}
	m.rt.mu.Lock()
	defer m.rt.mu.Unlock()
	return m.rt.accepting[s]
}

// tokenBytes returns the bytes of a non-special token, or nil.
func (m *Matcher) tokenBytes(tok int32) []byte {
	v := m.g.vocab
	if v.special[tok] || v.bytes == nil {
		return nil
	}
	return v.bytes[tok]
}
