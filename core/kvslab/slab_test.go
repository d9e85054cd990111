package kvslab

import (
	"errors"
	"strings"
	"testing"
)

// sizeOnly is an Arena that reports a size and holds no memory: New only reads Size.
type sizeOnly int64

func (a sizeOnly) Size() int64                  { return int64(a) }
func (a sizeOnly) Copy(dst, src, n int64) error { return errors.New("sizeOnly: no memory") }

// hybrid is GLM-5.3-Flash's cache layout: 11 MLA layers (540,672 bytes a block), their
// pooled indexer keys (5,632 bytes a block) and the 34 KDA layers' recurrent state
// (152,633,344 bytes a sequence). Sixteen state pages hold 433,617 pool-key pages.
func hybrid() []GroupSpec {
	return []GroupSpec{
		{Name: "mla", Kind: Full, Layers: 11, BytesPerToken: 768, PageTokens: 64},
		{Name: "kpool", Kind: Compressed, Layers: 11, BytesPerToken: 32, PageTokens: 64, Ratio: 4},
		{Name: "kda", Kind: Recurrent, Layers: 1, BytesPerToken: 152633344, PageTokens: 64, Checkpoints: 4},
	}
}

// TestDefaultSlabKeepsPagesAddressable sizes a hybrid layout whose largest page is far
// larger than its smallest: the default slab shrinks below DefaultSlabPages state pages to
// the largest one whose pool-key pages a page id still names, and a pool of it is built.
func TestDefaultSlabKeepsPagesAddressable(t *testing.T) {
	cfg := Config{Groups: hybrid()}
	z, err := Size(cfg, 16<<30, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(5632) * (SlotMask + 1); z.SlabBytes != want {
		t.Fatalf("default slab %d bytes, want %d (65,536 pool-key pages)", z.SlabBytes, want)
	}
	for _, g := range z.Groups {
		if g.PagesPerSlab < 1 || g.PagesPerSlab > SlotMask+1 {
			t.Errorf("group %q: %d pages a slab", g.Name, g.PagesPerSlab)
		}
	}
	if z.ContextTokens < 128<<10 {
		t.Errorf("16 GiB holds one sequence of %d tokens:\n%s", z.ContextTokens, z)
	}
	// The pool itself, over an arena of three slabs that holds no memory.
	p, err := New(cfg, sizeOnly(3*z.SlabBytes))
	if err != nil {
		t.Fatal(err)
	}
	if p.SlabBytes() != z.SlabBytes || p.Slabs() != 3 {
		t.Fatalf("pool of %d slabs of %d bytes, want 3 of %d", p.Slabs(), p.SlabBytes(), z.SlabBytes)
	}

	// Layouts whose smallest page is not far below the largest keep DefaultSlabPages.
	even := Config{Groups: []GroupSpec{full("kv", 16), {Name: "ssm", Kind: Recurrent, Layers: 1, BytesPerToken: 4096, PageTokens: 16}}}
	if z, err := Size(even, 1<<20, 1); err != nil || z.SlabBytes != DefaultSlabPages*4096 {
		t.Fatalf("even layout: slab %d bytes (%v), want %d", z.SlabBytes, err, DefaultSlabPages*4096)
	}
}

// TestNoSlabAddressesEveryGroup refuses a layout where one page of the largest group holds
// more pages of the smallest than a page id addresses, naming both groups.
func TestNoSlabAddressesEveryGroup(t *testing.T) {
	groups := hybrid()
	groups[1].BytesPerToken = 1 // 176-byte pool-key pages: a state page holds 867,235
	_, err := Size(Config{Groups: groups}, 16<<30, 1)
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("error %v, want ErrInvalidSpec", err)
	}
	for _, want := range []string{`"kda"`, `"kpool"`, "no slab size works", "tokens per page"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
}
