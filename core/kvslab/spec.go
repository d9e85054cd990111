package kvslab

import (
	"errors"
	"fmt"
)

// Kind is the kind of state a cache group holds.
type Kind uint8

const (
	// Full is full attention: every token's K/V (or latent) is kept.
	Full Kind = iota
	// SlidingWindow keeps the last Window tokens; pages wholly behind the window are released.
	SlidingWindow
	// Compressed keeps one entry per Ratio tokens (DeepSeek-V4 compressed attention, indexer keys).
	Compressed
	// Recurrent keeps one fixed-size state per sequence plus checkpoints at block ends.
	Recurrent
)

func (k Kind) String() string {
	switch k {
	case Full:
		return "full"
	case SlidingWindow:
		return "sliding-window"
	case Compressed:
		return "compressed"
	case Recurrent:
		return "recurrent"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// GroupSpec describes one cache group.
type GroupSpec struct {
	Name   string
	Kind   Kind
	Layers int
	// BytesPerToken is, per layer, the bytes of one token (Full, SlidingWindow), of one
	// entry (Compressed) or of one state (Recurrent).
	BytesPerToken int
	// PageTokens is the number of tokens one page covers (for Recurrent groups: the
	// checkpoint interval). All groups of a pool share one value, the block size.
	PageTokens int
	// Window is the sliding window in tokens: a token at position p sees [p-Window+1, p].
	Window int
	// Ratio is the number of tokens per compressed entry; it divides PageTokens.
	Ratio int
	// Checkpoints is the number of state checkpoints a recurrent sequence keeps for prefix
	// reuse (0: recurrent sequences are never served from the prefix cache).
	Checkpoints int
}

// Config is a pool's configuration.
type Config struct {
	Groups []GroupSpec
	// SlabBytes is the slab size; 0 picks DefaultSlabPages times the largest page, or the
	// largest slab whose pages of every group a PageID addresses when that is smaller.
	SlabBytes int64
	// MaxSeqs, when positive, prepares that many sequences up front (the scheduler's cap on
	// running sequences), so that opening them allocates nothing; more may still be opened.
	MaxSeqs int
	// ChunkTokens and InFlightTokens are, for Size, the most tokens a sequence reserves at
	// once (a step's prefill chunk; 0 counts one token, a sequence that decodes) and the
	// most it may have in flight meanwhile (the chunk of a step still running while the
	// next is reserved, ReserveInFlight). A sliding-window sequence holds the pages of its
	// window and of all those tokens at once; a recurrent one keeps the checkpoints the
	// tokens in flight reach beyond its quota.
	ChunkTokens, InFlightTokens int
}

const (
	// SlotBits is the number of low bits of a PageID that hold the slot inside its slab.
	SlotBits = 16
	// SlotMask masks the slot out of a PageID.
	SlotMask = 1<<SlotBits - 1
	// MaxSlabs is the number of slabs a pool can address.
	MaxSlabs = 1<<(32-SlotBits) - 1
	// DefaultSlabPages is the number of largest pages in a default slab (fewer where a
	// slab that large would hold more than SlotMask+1 pages of the smallest group).
	DefaultSlabPages = 16
)

// PageID names a page: slab<<SlotBits | slot.
type PageID uint32

// NoPage marks a block that holds no page in a group's page table.
const NoPage PageID = ^PageID(0)

// Slab is the slab the page lives in.
func (id PageID) Slab() int { return int(id >> SlotBits) }

// Slot is the page's slot inside its slab.
func (id PageID) Slot() int { return int(id & SlotMask) }

// SeqID names an open sequence of a pool.
type SeqID int32

var (
	// ErrNoSpace reports that the pool cannot hold the request even after evicting every
	// unreferenced prefix-cache page. The scheduler acts on it (preempts or waits).
	ErrNoSpace = errors.New("kvslab: out of cache pages")
	// ErrUnknownSeq reports a SeqID that is not open (never opened, or already freed).
	ErrUnknownSeq = errors.New("kvslab: unknown sequence")
	// ErrInvalidSpec reports a configuration that cannot work.
	ErrInvalidSpec = errors.New("kvslab: invalid cache spec")
)

// PageBytes is the size of one page of the group.
func (g GroupSpec) PageBytes() int64 {
	switch g.Kind {
	case Compressed:
		return int64(g.Layers) * int64(g.PageTokens/g.Ratio) * int64(g.BytesPerToken)
	case Recurrent:
		return int64(g.Layers) * int64(g.BytesPerToken)
	default:
		return int64(g.Layers) * int64(g.PageTokens) * int64(g.BytesPerToken)
	}
}

// Validate reports the first problem with the spec.
func (g GroupSpec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: group %q: %s", ErrInvalidSpec, g.Name, fmt.Sprintf(format, args...))
	}
	if g.Name == "" {
		return fmt.Errorf("%w: a group has no name", ErrInvalidSpec)
	}
	if g.Kind > Recurrent {
		return bad("unknown kind %d", g.Kind)
	}
	if g.Layers <= 0 {
		return bad("layers must be positive, got %d", g.Layers)
	}
	if g.BytesPerToken <= 0 {
		return bad("bytes per token must be positive, got %d", g.BytesPerToken)
	}
	if g.PageTokens <= 0 {
		return bad("tokens per page must be positive, got %d", g.PageTokens)
	}
	switch g.Kind {
	case SlidingWindow:
		if g.Window < g.PageTokens {
			return bad("window of %d tokens is smaller than one page of %d tokens", g.Window, g.PageTokens)
		}
	case Compressed:
		if g.Ratio <= 0 || g.PageTokens%g.Ratio != 0 {
			return bad("ratio %d must be positive and divide the %d tokens of a page", g.Ratio, g.PageTokens)
		}
	case Recurrent:
		if g.Checkpoints < 0 {
			return bad("checkpoints must not be negative, got %d", g.Checkpoints)
		}
	}
	if g.Kind != SlidingWindow && g.Window != 0 {
		return bad("window is set but the group is %s", g.Kind)
	}
	if g.Kind != Compressed && g.Ratio != 0 {
		return bad("ratio is set but the group is %s", g.Kind)
	}
	if g.Kind != Recurrent && g.Checkpoints != 0 {
		return bad("checkpoints are set but the group is %s", g.Kind)
	}
	return nil
}

// Validate reports the first problem with the configuration and returns the slab size it
// resolves to.
func (c Config) slabBytes() (int64, error) {
	if len(c.Groups) == 0 {
		return 0, fmt.Errorf("%w: no cache groups", ErrInvalidSpec)
	}
	if len(c.Groups) > 1<<15 {
		return 0, fmt.Errorf("%w: %d cache groups", ErrInvalidSpec, len(c.Groups))
	}
	names := map[string]bool{}
	for _, g := range c.Groups {
		if err := g.Validate(); err != nil {
			return 0, err
		}
		if names[g.Name] {
			return 0, fmt.Errorf("%w: two groups are named %q", ErrInvalidSpec, g.Name)
		}
		names[g.Name] = true
		if g.PageTokens != c.Groups[0].PageTokens {
			return 0, fmt.Errorf("%w: groups %q and %q have %d and %d tokens per page; all groups share one block size",
				ErrInvalidSpec, c.Groups[0].Name, g.Name, c.Groups[0].PageTokens, g.PageTokens)
		}
	}
	slab := c.SlabBytes
	if slab == 0 {
		var err error
		if slab, err = defaultSlabBytes(c.Groups); err != nil {
			return 0, err
		}
	}
	if slab < 0 {
		return 0, fmt.Errorf("%w: slab size %d is negative", ErrInvalidSpec, slab)
	}
	if c.MaxSeqs < 0 {
		return 0, fmt.Errorf("%w: max sequences %d is negative", ErrInvalidSpec, c.MaxSeqs)
	}
	for _, g := range c.Groups {
		pb := g.PageBytes()
		if slab < pb {
			return 0, fmt.Errorf("%w: a slab of %d bytes cannot hold one page of group %q (%d bytes)", ErrInvalidSpec, slab, g.Name, pb)
		}
		if slab/pb > SlotMask+1 {
			return 0, fmt.Errorf("%w: a slab of %d bytes holds %d pages of group %q, more than the %d a page id can address; use smaller slabs",
				ErrInvalidSpec, slab, slab/pb, g.Name, SlotMask+1)
		}
	}
	return slab, nil
}

// defaultSlabBytes is the slab of a Config that sets none: DefaultSlabPages pages of the
// largest group, or less where such a slab would hold more pages of the smallest group than
// a page id's slot addresses (SlotMask+1). A hybrid model's recurrent state page can be
// tens of thousands of times larger than a page of its attention keys; the slab is then the
// largest one whose every page a page id still names. It fails when even one page of the
// largest group holds more pages of the smallest than that.
func defaultSlabBytes(groups []GroupSpec) (int64, error) {
	large, small := groups[0], groups[0]
	for _, g := range groups[1:] {
		if g.PageBytes() > large.PageBytes() {
			large = g
		}
		if g.PageBytes() < small.PageBytes() {
			small = g
		}
	}
	limit := small.PageBytes() * (SlotMask + 1)
	if large.PageBytes() > limit {
		return 0, fmt.Errorf("%w: a page of group %q (%d bytes) holds %d pages of group %q (%d bytes), more than the %d one slab can address by page id; "+
			"no slab size works: raise the tokens per page (the block size) so that the pages of %q grow",
			ErrInvalidSpec, large.Name, large.PageBytes(), large.PageBytes()/small.PageBytes(), small.Name, small.PageBytes(), SlotMask+1, small.Name)
	}
	return min(DefaultSlabPages*large.PageBytes(), limit), nil
}
