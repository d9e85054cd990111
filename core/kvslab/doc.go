// Package kvslab is Resin's unified cache pool: one arena of bytes, cut into equal slabs,
// that holds every kind of per-sequence state a model needs.
//
// A model declares its cache groups (GroupSpec): full attention, sliding window, compressed
// (one entry per Ratio tokens) and recurrent (one state per sequence plus checkpoints).
// Slabs are lent to a group when it needs a page and return to the pool as soon as they are
// empty, so memory is never split up front between kinds.
//
// # Pages and addresses
//
// Every group cuts the slabs it borrows into pages of its own size (PageBytes). A page id
// encodes the slab and the slot inside it:
//
//	PageID = slab<<SlotBits | slot
//	offset = (PageID >> SlotBits) * SlabBytes + (PageID & SlotMask) * PageBytes(group)
//
// so a kernel turns a page id into an address with a shift, a mask and two multiplies.
// A page holds its group's layers one after another: layer l's block starts at
//
//	offset + l * PageBytes(group)/Layers
//
// and is PageTokens*BytesPerToken bytes (full, sliding window), PageTokens/Ratio entries
// of BytesPerToken (compressed) or one state of BytesPerToken (recurrent). How a layer's
// block is laid out inside (K then V, or interleaved per token; heads; dtype) belongs to the
// model that owns the group and to its kernels; core/kernels/cuda.KVSlabLayout describes the
// [K | V][token][kv head][head dim] layout that the dense models and the paged-attention
// kernel use.
//
// A token's flat slot (as vLLM's slot mapping) is PageID*PageTokens + position%PageTokens;
// in a compressed group, whose page holds PageTokens/Ratio entries, it is
// PageID*(PageTokens/Ratio) + (position%PageTokens)/Ratio.
//
// # Sequences and blocks
//
// All groups of a pool share PageTokens, the block size: block b of a sequence covers tokens
// [b*PageTokens, (b+1)*PageTokens) and PageTable(seq, g)[b] is the group's page for it.
// Reserve grows a sequence in every group at once or not at all; Truncate rolls it back
// (speculative decoding); Free releases it.
//
// # Prefix cache
//
// Commit registers a sequence's full blocks under a hash chained over (parent hash, token
// ids). Open attaches the longest cached prefix that every group can serve: all blocks for
// full and compressed groups, the blocks the next token can see for sliding windows, and a
// checkpoint at exactly the hit point for recurrent groups. Cached pages are reference
// counted; unreferenced ones stay until evicted, least recently used first, and when a group
// needs a slab the pool prefers slabs whose pages are all evictable. A group takes a free
// slot on a slab where it has live pages before any other; with PackPages it also reuses the
// slots of idle cached pages there before it takes a free slab, so that a sequence's pages
// stay on as few slabs as Size counted for it (a slab with a live page cannot go to another
// group).
//
// # Page copies
//
// Two operations need a page's bytes copied: Truncate into a block the sequence shares
// (copy-on-write) and Open with a recurrent checkpoint to restore. By default the pool
// copies through the arena at once. With DeferCopies it records them instead (PageCopy),
// so the engine can hand them to the runner as ordered operations executed before the
// step's forward, on the runner's own stream and after any step still running: the page
// table already names the destination, and the source is held until RetireCopies.
package kvslab
