package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
)

// SeqSlots ties each running request to the device state S of its sequence (a slot of a
// first-cut runner's per-sequence caches, which hold the tokens computed so far). New
// takes a free slot, Free returns one, Len says how many tokens a state holds; Name
// prefixes the errors. Resume, when set, takes a slot for a request that resumes past its
// first token without one (a prefix hit) and fills it from plan sequence i's cache pages;
// Drafts, when set, lets plans carry draft tokens (the runner verifies them).
type SeqSlots[S any] struct {
	Name   string
	New    func(c *cudart.Ctx) (S, error)
	Free   func(s S)
	Len    func(s S) int
	Resume func(c *cudart.Ctx, p *engine.BatchPlan, i int) (S, error)
	Drafts bool
	seqs   map[uint64]S
}

// Bind frees the slots of plan p's released requests and returns the state and the
// tokens of each of its sequences, taking a slot for each new request and beginning a
// restarted one again in its slot. It refuses draft tokens (unless Drafts), a request that
// resumes past its first token without a slot (a prefix hit; unless Resume), and one whose
// state holds a different count of tokens than the plan has computed.
func (sl *SeqSlots[S]) Bind(c *cudart.Ctx, p *engine.BatchPlan) ([]S, [][]int32, error) {
	if sl.seqs == nil {
		sl.seqs = map[uint64]S{}
	}
	for _, rel := range p.Released {
		if s, ok := sl.seqs[rel.ReqID]; ok {
			sl.Free(s)
			delete(sl.seqs, rel.ReqID)
		}
	}
	seqs, toks := make([]S, p.NumSeqs()), make([][]int32, p.NumSeqs())
	for i := range seqs {
		id, done := p.ReqIDs[i], int(p.Computed[i])
		if !sl.Drafts && p.NumDrafts != nil && p.NumDrafts[i] > 0 {
			return nil, nil, fmt.Errorf("%s on the GPU: draft tokens (no MTP on the device yet)", sl.Name)
		}
		s, ok := sl.seqs[id]
		if ok && done == 0 && sl.Len(s) > 0 { // restarted: begin again in its slot
			sl.Free(s)
			delete(sl.seqs, id)
			ok = false
		}
		if !ok {
			var err error
			switch {
			case done == 0:
				s, err = sl.New(c)
			case sl.Resume != nil:
				s, err = sl.Resume(c, p, i)
			default:
				return nil, nil, fmt.Errorf("%s on the GPU: request %d resumes at %d cached tokens (prefix hits are not on the device yet)", sl.Name, id, done)
			}
			if err != nil {
				return nil, nil, err
			}
			sl.seqs[id] = s
		}
		if n := sl.Len(s); n != done {
			return nil, nil, fmt.Errorf("%s on the GPU: request %d continues at %d tokens, its device state holds %d", sl.Name, id, done, n)
		}
		seqs[i] = s
		toks[i], _ = p.Seq(i)
	}
	return seqs, toks, nil
}

// Has reports whether request id holds a slot (a plan check counting the free slots
// before Bind asks).
func (sl *SeqSlots[S]) Has(id uint64) bool {
	_, ok := sl.seqs[id]
	return ok
}

// OpenSlotDevice opens what a first-cut runner of model name needs from opts: its limits
// (a field zero or negative: MaxTokens 8192, MaxSeqs min(256, MaxTokens), MaxRows
// MaxSeqs), the kernel cache opts.KernelCache (empty: cudart's default) and GPU
// opts.Ordinal, which the caller closes.
func OpenSlotDevice(opts Options, name string) (Limits, *cudart.KernelCache, *cudart.Device, error) {
	l := slotLimits(opts.Limits)
	cache, err := cudart.OpenKernelCache(opts.KernelCache)
	if err != nil {
		return Limits{}, nil, nil, err
	}
	dev, err := cudart.OpenDevice(opts.Ordinal)
	if err != nil {
		return Limits{}, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return l, cache, dev, nil
}

// slotLimits is l with each field zero or negative defaulted, as OpenSlotDevice says.
func slotLimits(l Limits) Limits {
	if l.MaxTokens <= 0 {
		l.MaxTokens = 8192
	}
	if l.MaxSeqs <= 0 {
		l.MaxSeqs = min(256, l.MaxTokens)
	}
	if l.MaxRows <= 0 {
		l.MaxRows = l.MaxSeqs
	}
	return l
}

// RankOrdinals returns the GPU ordinals of size ranks from GPU first: first+r for rank r
// where the machine shows that many GPUs, else first for every rank (several ranks on one
// GPU, as NCCL_MULTI_RANK_GPU_ENABLE=1 allows).
func RankOrdinals(first, size int) ([]int, error) {
	n, err := cudart.DeviceCount()
	if err != nil {
		return nil, err
	}
	ords := make([]int, size)
	for r := range ords {
		ords[r] = first
		if first+size <= n {
			ords[r] += r
		}
	}
	return ords, nil
}

// OpenRankDevices is OpenSlotDevice for a layout of size ranks of model name: the limits,
// the kernel cache, and rank r's GPU at devs[r] (RankOrdinals from opts.Ordinal), which
// the caller closes (CloseDevices) until a layout owns them.
func OpenRankDevices(opts Options, name string, size int) (Limits, *cudart.KernelCache, []*cudart.Device, error) {
	lim, cache, dev0, err := OpenSlotDevice(opts, name)
	if err != nil {
		return Limits{}, nil, nil, err
	}
	devs := []*cudart.Device{dev0}
	ords, err := RankOrdinals(opts.Ordinal, size)
	if err != nil {
		dev0.Close()
		return Limits{}, nil, nil, err
	}
	for r := 1; r < size; r++ {
		d, err := cudart.OpenDevice(ords[r])
		if err != nil {
			CloseDevices(devs)
			return Limits{}, nil, nil, fmt.Errorf("%s: rank %d: %w", name, r, err)
		}
		devs = append(devs, d)
	}
	return lim, cache, devs, nil
}

// CloseDevices closes every device of devs.
func CloseDevices(devs []*cudart.Device) {
	for _, d := range devs {
		d.Close()
	}
}
