package deepseekv4flash

import (
	"fmt"
	"unsafe"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// CacheGroups declares the per-sequence state the model keeps: one full-attention group
// holding every layer's keys and values in float32.
//
//	page of group 0: [layers][K|V][pageTokens][kvHeads][headDim] float32
func CacheGroups(c *Config, pageTokens int) []kvslab.GroupSpec {
	return []kvslab.GroupSpec{{
		Name:          "kv",
		Kind:          kvslab.Full,
		Layers:        c.NumHiddenLayers,
		BytesPerToken: 2 * c.NumKeyValueHeads * c.HeadDim * 4,
		PageTokens:    pageTokens,
	}}
}

// KVCache views a kvslab pool's host arena as each layer's paged keys and values.
type KVCache struct {
	Layers []ref.PagedKV
}

// NewKVCache binds the model's layers to pool, whose first group must be CacheGroups'.
func NewKVCache(c *Config, pool *kvslab.Pool) (*KVCache, error) {
	hm, ok := pool.Arena().(kvslab.HostMemory)
	if !ok {
		return nil, fmt.Errorf("kv cache: the reference forward needs a host-memory arena, got %T", pool.Arena())
	}
	want := CacheGroups(c, pool.BlockTokens())[0]
	if g := pool.Groups(); len(g) == 0 || g[0].Kind != want.Kind || g[0].Layers != want.Layers || g[0].BytesPerToken != want.BytesPerToken {
		return nil, fmt.Errorf("kv cache: pool group 0 %+v does not match the model's %+v", pool.Groups(), want)
	}
	raw := hm.Bytes(0, hm.Size())
	if len(raw) < 4 {
		return nil, fmt.Errorf("kv cache: arena of %d bytes", len(raw))
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4)
	pt := pool.BlockTokens()
	e := pt * c.NumKeyValueHeads * c.HeadDim // floats of one layer's K (or V) in a page
	kv := &KVCache{Layers: make([]ref.PagedKV, c.NumHiddenLayers)}
	for l := range kv.Layers {
		off := l * 2 * e
		kv.Layers[l] = ref.PagedKV{
			K: all[off:], V: all[off+e:], PageTokens: pt, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim,
			PageOffset: func(page uint32) int { return int(pool.PageOffset(0, kvslab.PageID(page)) / 4) },
		}
	}
	return kv, nil
}
