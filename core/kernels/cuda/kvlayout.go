package cuda

import (
	"fmt"
	"math"
)

const (
	// PageSlotBits is the number of low bits of a page id that hold the page's slot in its
	// slab. It equals kvslab.SlotBits and paged_attention.cu's RESIN_SLOT_BITS (a test
	// checks both), so the kernel reads kvslab page tables as they are.
	PageSlotBits = 16
	// PageSlotMask masks the slot out of a page id.
	PageSlotMask = 1<<PageSlotBits - 1
)

// KVSlabLayout says where one attention layer's keys and values sit in the paged cache the
// kernel reads, in elements of the cache's type (float32, or bf16 for the bf16 kernels)
// from the cache pointers. Page id p (a kvslab.PageID,
// slab<<PageSlotBits | slot) starts at
//
//	base(p) = (p >> PageSlotBits) * SlabElems + (p & PageSlotMask) * PageElems
//
// and the keys (values) of token t of the page, kv head h, at
//
//	base(p) + KOffset + (t*KVHeads + h) * HeadDim     (VOffset for values)
//
// which is kvslab.Pool.PageOffset divided by the element size, plus where the layer's keys and values sit
// inside a page. NewKVSlabLayout builds it for a kvslab group; PackedKV for pages packed
// back to back in separate key and value buffers.
type KVSlabLayout struct {
	SlabElems int64 // elements per slab: kvslab.Pool.SlabBytes()/element size
	PageElems int64 // elements per page: kvslab.GroupSpec.PageBytes()/element size
	KOffset   int64 // elements from a page's start to this layer's keys
	VOffset   int64 // elements from a page's start to this layer's values
}

// NewKVSlabLayout is the layout of layer `layer` of a kvslab full-attention group whose
// pages hold, in float32,
//
//	page: [layers][K|V][pageTokens][kvHeads][headDim]
//
// (BytesPerToken = 2*kvHeads*headDim*4, as models/llama and the dense template declare):
// inside the layer's block of the page the keys of every token come first, then the values.
// slabBytes is kvslab.Pool.SlabBytes() and pageBytes the group's PageBytes(). Keys and
// values are then read through one pointer: the arena's start.
func NewKVSlabLayout(slabBytes, pageBytes int64, layer, pageTokens, kvHeads, headDim int) (KVSlabLayout, error) {
	return NewKVSlabLayoutOf(F32, slabBytes, pageBytes, layer, pageTokens, kvHeads, headDim)
}

// NewKVSlabLayoutOf is NewKVSlabLayout for pages holding elements of type dt (BF16 for
// the bf16 kernels: BytesPerToken = 2*kvHeads*headDim*2); the layout then counts elements
// of dt.
func NewKVSlabLayoutOf(dt DType, slabBytes, pageBytes int64, layer, pageTokens, kvHeads, headDim int) (KVSlabLayout, error) {
	size := int64(dt.Size())
	if size == 0 {
		return KVSlabLayout{}, fmt.Errorf("cuda.NewKVSlabLayout: unknown element type %d", dt)
	}
	if pageTokens <= 0 || kvHeads <= 0 || headDim <= 0 {
		return KVSlabLayout{}, fmt.Errorf("cuda.NewKVSlabLayout: page tokens %d, kv heads %d and head dim %d must be positive",
			pageTokens, kvHeads, headDim)
	}
	if slabBytes <= 0 || pageBytes <= 0 || slabBytes%size != 0 || pageBytes%size != 0 {
		return KVSlabLayout{}, fmt.Errorf("cuda.NewKVSlabLayout: slab of %d bytes and page of %d bytes must be positive multiples of %d (%s)",
			slabBytes, pageBytes, size, dt)
	}
	half := int64(pageTokens) * int64(kvHeads) * int64(headDim) // one layer's keys (or values) in a page
	if layer < 0 || (int64(layer)+1)*2*half > pageBytes/size {
		return KVSlabLayout{}, fmt.Errorf("cuda.NewKVSlabLayout: layer %d does not fit a page of %d bytes holding %d %s keys and values per layer",
			layer, pageBytes, 2*half, dt)
	}
	l := KVSlabLayout{SlabElems: slabBytes / size, PageElems: pageBytes / size, KOffset: int64(layer) * 2 * half}
	l.VOffset = l.KOffset + half
	return l, nil
}

// PackedKV is the layout of pages packed back to back (page p at p*pageElems) in separate
// key and value buffers, as ref.PagedKV without PageOffset: a slab of 1<<PageSlotBits pages
// makes the slab-and-slot decoding the identity.
func PackedKV(pageElems int64) KVSlabLayout {
	return KVSlabLayout{SlabElems: pageElems << PageSlotBits, PageElems: pageElems}
}

// PageBase is the element offset of page id's first element.
func (l KVSlabLayout) PageBase(id uint32) int64 {
	return int64(id>>PageSlotBits)*l.SlabElems + int64(id&PageSlotMask)*l.PageElems
}

// KeyOffset is the element offset of this layer's keys in page id (token 0, kv head 0).
func (l KVSlabLayout) KeyOffset(id uint32) int64 { return l.PageBase(id) + l.KOffset }

// ValueOffset is the element offset of this layer's values in page id (token 0, kv head 0).
func (l KVSlabLayout) ValueOffset(id uint32) int64 { return l.PageBase(id) + l.VOffset }

// Check reports the first reason the layout cannot hold a layer of pageTokens tokens of
// kvHeads×headDim keys and values per page.
func (l KVSlabLayout) Check(pageTokens, kvHeads, headDim int) error {
	half := int64(pageTokens) * int64(kvHeads) * int64(headDim)
	switch {
	case l.PageElems <= 0 || l.SlabElems < l.PageElems:
		return fmt.Errorf("cuda.KVSlabLayout: page of %d elements in a slab of %d: the page must be positive and fit the slab (zero layout? use PackedKV or NewKVSlabLayout)",
			l.PageElems, l.SlabElems)
	case l.SlabElems > math.MaxInt64>>(32-PageSlotBits+1):
		return fmt.Errorf("cuda.KVSlabLayout: slab of %d elements is too large to address %d slabs", l.SlabElems, 1<<(32-PageSlotBits))
	case l.KOffset < 0 || l.VOffset < 0 || l.KOffset+half > l.PageElems || l.VOffset+half > l.PageElems:
		return fmt.Errorf("cuda.KVSlabLayout: keys at %d and values at %d (%d elements each) do not fit a page of %d elements",
			l.KOffset, l.VOffset, half, l.PageElems)
	}
	return nil
}
