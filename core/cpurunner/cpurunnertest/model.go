// Package cpurunnertest is a tiny model built on core/cpurunner, for tests of code that
// runs a CPU runner (generate --logits-out, the engine wiring itself) without loading a
// real model.
//
// The model keeps every token it reads in the cache pool, one entry (position, token) per
// slot, and computes the logits after position p from all the entries 0..p it reads back
// through the page table. A wrong slot mapping or page table, or a position that was never
// computed, therefore changes the logits or fails the step, while a correct run gives
// exactly Logits of the same tokens. Runner is wired the way a scaffolded model runner
// is: an embedded *cpurunner.Runner over a closure that checks the runner is bound.
package cpurunnertest

import (
	"encoding/binary"
	"fmt"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Name is the runner's name.
const Name = "cputoy"

// entryBytes is one token's cache entry: position+1 (0 = never written) and token.
const entryBytes = 8

// Config describes the model. Zero values take the defaults noted.
type Config struct {
	VocabSize  int // default 64
	MaxContext int // default 512
	PageTokens int // default 4
	EOS        []int32
}

func (c Config) withDefaults() Config {
	if c.VocabSize == 0 {
		c.VocabSize = 64
	}
	if c.MaxContext == 0 {
		c.MaxContext = 512
	}
	if c.PageTokens == 0 {
		c.PageTokens = 4
	}
	return c
}

// Runner is the model's runner: bind it to a pool with NewPool or Bind before Execute.
type Runner struct {
	*cpurunner.Runner
	cfg  Config
	pool *kvslab.Pool
	mem  kvslab.HostMemory
}

// NewRunner returns an unbound runner of the model.
func NewRunner(cfg Config) *Runner {
	cfg = cfg.withDefaults()
	r := &Runner{cfg: cfg}
	info := engine.RunnerInfo{
		Name: Name, VocabSize: cfg.VocabSize, MaxContext: cfg.MaxContext, EOS: cfg.EOS,
		CacheGroups: r.CacheGroups(),
	}
	r.Runner = cpurunner.New(info, cpurunner.ForwardFunc(func(p *engine.BatchPlan, logits []float32) error {
		if r.pool == nil {
			return cpurunner.ErrNotBound
		}
		return r.forward(p, logits)
	}))
	return r
}

// Open returns an Opener-shaped function (core/cli.Opener) that ignores dir and opens the
// model of cfg with a host pool of cacheBytes bytes (0 = 1 MiB).
func Open(cfg Config) func(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	return func(_ string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
		r := NewRunner(cfg)
		if cacheBytes == 0 {
			cacheBytes = 1 << 20
		}
		pool, err := r.NewPool(cacheBytes)
		if err != nil {
			return nil, nil, err
		}
		return r, pool, nil
	}
}

// CacheGroups returns the one full-attention group the model keeps.
func (r *Runner) CacheGroups() []kvslab.GroupSpec {
	return []kvslab.GroupSpec{{Name: "tokens", Kind: kvslab.Full, Layers: 1, BytesPerToken: entryBytes, PageTokens: r.cfg.PageTokens}}
}

// NewPool builds a host pool of bytes bytes for the model and binds the runner to it.
func (r *Runner) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(r.CacheGroups(), bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	return pool, r.Bind(pool)
}

// Bind makes the runner read and write its cache in pool.
func (r *Runner) Bind(pool *kvslab.Pool) error {
	mem, ok := pool.Arena().(kvslab.HostMemory)
	if !ok {
		return fmt.Errorf("%s: the arena (%T) is not host memory", Name, pool.Arena())
	}
	if g := pool.Groups(); len(g) != 1 || g[0] != r.CacheGroups()[0] {
		return fmt.Errorf("%s: pool groups %+v are not the model's %+v", Name, g, r.CacheGroups())
	}
	r.pool, r.mem = pool, mem
	return nil
}

// forward writes every token of p into its slot, then computes each logits row from the
// entries 0..position it reads back through the sequence's page table.
func (r *Runner) forward(p *engine.BatchPlan, logits []float32) error {
	bt := r.pool.BlockTokens()
	gp := &p.Groups[0]
	for k, slot := range gp.SlotMapping {
		e := r.entry(kvslab.PageID(slot/int64(bt)), int(slot%int64(bt)))
		binary.LittleEndian.PutUint32(e[0:], uint32(p.Positions[k]+1))
		binary.LittleEndian.PutUint32(e[4:], uint32(p.Tokens[k]))
	}
	vocab := r.cfg.VocabSize
	for i := 0; i < p.NumSeqs(); i++ {
		table := p.PageTableOf(0, i)
		for j := p.LogitsStart[i]; j < p.LogitsStart[i+1]; j++ {
			pos := int(p.Positions[p.LogitsIndices[j]])
			h := uint64(seed)
			for q := 0; q <= pos; q++ {
				if q/bt >= len(table) || table[q/bt] == kvslab.NoPage {
					return fmt.Errorf("request %d: position %d has no page", p.ReqIDs[i], q)
				}
				e := r.entry(table[q/bt], q%bt)
				if got := int(binary.LittleEndian.Uint32(e[0:])) - 1; got != q {
					return fmt.Errorf("request %d: the cache entry of position %d holds position %d", p.ReqIDs[i], q, got)
				}
				h = chain(h, int32(binary.LittleEndian.Uint32(e[4:])))
			}
			fill(logits[int(j)*vocab:int(j+1)*vocab], h)
		}
	}
	return nil
}

func (r *Runner) entry(id kvslab.PageID, off int) []byte {
	return r.mem.Bytes(r.pool.PageOffset(0, id)+int64(off)*entryBytes, entryBytes)
}

// Logits returns what the model computes after each of tokens (fed from position 0),
// row-major [len(tokens)][vocab]: row p is the distribution of the token at p+1.
func Logits(vocab int, tokens []int32) []float32 {
	out := make([]float32, len(tokens)*vocab)
	h := uint64(seed)
	for p, t := range tokens {
		h = chain(h, t)
		fill(out[p*vocab:(p+1)*vocab], h)
	}
	return out
}

// Reference returns the n tokens the model generates after prompt with the sampling row
// (positions from 0, as the engine's sampler sees them), computed directly.
func Reference(vocab int, prompt []int32, n int, row engine.SamplingRow) []int32 {
	var s engine.Sampler
	logits := make([]float32, vocab)
	h := uint64(seed)
	for _, t := range prompt {
		h = chain(h, t)
	}
	out := make([]int32, 0, n)
	for len(out) < n {
		fill(logits, h)
		t, _, _ := s.Sample(logits, row, len(prompt)+len(out), nil)
		out = append(out, t)
		h = chain(h, t)
	}
	return out
}

const seed = 0xC0FFEE

func mix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

func chain(h uint64, tok int32) uint64 { return mix(h ^ (uint64(uint32(tok))+1)<<20) }

// fill writes logits in [-4, 4) that depend only on h.
func fill(dst []float32, h uint64) {
	for v := range dst {
		dst[v] = float32(mix(h+uint64(v)*0x632BE59BD9B4E019)>>40)/(1<<24)*8 - 4
	}
}
