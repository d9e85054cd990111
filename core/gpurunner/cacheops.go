package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// arenaCopy is one cache op as a copy inside the device arena: N bytes from byte Src to
// byte Dst.
type arenaCopy struct {
	Dst, Src, N int64
}

// cacheCopies appends to dst the arena copies that execute ops (a plan's CacheOps) on the
// pages pool cuts, in order, and returns it: an OpCopyPage of group g copies the whole
// page Src onto Dst, at the offsets pool.PageOffset names (what engine.ApplyCacheOps
// does through kvslab.Pool.CopyPage). A copy of a page onto itself is dropped. An op of
// an unknown kind, group or page, or whose page would reach past its slab, is refused
// before anything is queued.
func cacheCopies(dst []arenaCopy, ops []engine.CacheOp, pool *kvslab.Pool) ([]arenaCopy, error) {
	groups := pool.Groups()
	slabs, slabBytes := pool.Slabs(), pool.SlabBytes()
	for i, op := range ops {
		if op.Kind != engine.OpCopyPage {
			return dst, fmt.Errorf("gpurunner: cache op %d has unknown kind %s", i, op.Kind)
		}
		g := int(op.Group)
		if g < 0 || g >= len(groups) {
			return dst, fmt.Errorf("gpurunner: cache op %d copies a page of group %d; the pool has %d groups", i, op.Group, len(groups))
		}
		n := groups[g].PageBytes()
		for _, id := range [2]kvslab.PageID{op.Src, op.Dst} {
			if id == kvslab.NoPage || id.Slab() >= slabs || int64(id.Slot()+1)*n > slabBytes {
				return dst, fmt.Errorf("gpurunner: cache op %d: page %#x of group %q is outside the pool (%d slabs of %d bytes, %d-byte pages)",
					i, uint32(id), groups[g].Name, slabs, slabBytes, n)
			}
		}
		if op.Src == op.Dst {
			continue
		}
		dst = append(dst, arenaCopy{Dst: pool.PageOffset(g, op.Dst), Src: pool.PageOffset(g, op.Src), N: n})
	}
	return dst, nil
}

// cacheOps executes plan's CacheOps (the runner declares RunnerInfo.ExecutesCacheOps):
// the page copies are queued on the runner's stream, so they run after the previous
// step's kernels wrote their sources and before this step's kernels read or write any
// page, with no wait on the host.
func (r *Runner) cacheOps(plan *engine.BatchPlan) error {
	if len(plan.CacheOps) == 0 {
		return nil
	}
	var err error
	if r.copies, err = cacheCopies(r.copies[:0], plan.CacheOps, r.pool); err != nil {
		return err
	}
	if len(r.copies) == 0 {
		return nil
	}
	return r.dev.Do(func(c *cudart.Ctx) error {
		for _, cp := range r.copies {
			if err := r.arena.CopyAsync(c, r.stream, cp.Dst, cp.Src, cp.N); err != nil {
				return fmt.Errorf("gpurunner: cache op: %w", err)
			}
		}
		return nil
	})
}
