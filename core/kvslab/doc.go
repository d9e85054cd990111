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
// Inside a page the layout is [layer][token or entry][bytes]: the bytes of token t
// (0 <= t < PageTokens) of layer l start at
//
//	offset + (l*PageTokens + t) * BytesPerToken              (full, sliding window)
//	offset + (l*(PageTokens/Ratio) + t/Ratio) * BytesPerToken  (compressed, entry t/Ratio)
//	offset + l * BytesPerToken                                (recurrent state of layer l)
//
// A token's flat slot (as vLLM's slot mapping) is PageID*PageTokens + position%PageTokens.
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
// needs a slab the pool prefers slabs whose pages are all evictable.
package kvslab
