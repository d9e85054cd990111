package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// kernelParams returns the C parameter declarations of kernel entry in file, read from
// its source, each with its whitespace collapsed to single spaces.
func kernelParams(t *testing.T, file, entry string) []string {
	t.Helper()
	src, err := files.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`RESIN_KERNEL void ` + entry + `\(([^)]*)\)`).FindSubmatch(src)
	if m == nil {
		t.Fatalf("%s defines no kernel %s", file, entry)
	}
	var params []string
	for _, p := range strings.Split(string(m[1]), ",") {
		params = append(params, strings.Join(strings.Fields(p), " "))
	}
	return params
}

// signature returns the C parameter kinds of kernel entry in file, read from its source.
func signature(t *testing.T, file, entry string) []argKind {
	t.Helper()
	var kinds []argKind
	for _, p := range kernelParams(t, file, entry) {
		switch {
		case strings.Contains(p, "*"):
			kinds = append(kinds, argPtr)
		case strings.HasPrefix(p, "long long "):
			kinds = append(kinds, argI64)
		case strings.HasPrefix(p, "float "):
			kinds = append(kinds, argF32)
		case strings.HasPrefix(p, "int "):
			kinds = append(kinds, argI32)
		default:
			t.Fatalf("%s: parameter %q of %s has a type the test does not know", file, p, entry)
		}
	}
	return kinds
}

// packAll builds a valid launch of every kernel, in a Kernels without a device.
func packAll(t testing.TB, k *Kernels) {
	t.Helper()
	check := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	check(packAddRMSNorm(&k.specs[kAddRMSNormF32], F32, 1, 2, 3, 4, 7, 4096, 1e-6))
	check(packAddRMSNorm(&k.specs[kAddRMSNormBF16], BF16, 1, 2, 3, 4, 7, 4096, 1e-6))
	check(packRMSNormBF16(&k.specs[kRMSNormBF16], 1, 2, 3, 7, 4096, 1e-6))
	check(packSiLUMulBF16(&k.specs[kSiLUMulBF16], 1, 2, 7, 11008))
	check(packEmbeddingBF16(&k.specs[kEmbeddingBF16], 1, 2, 3, 7, 4096, 32000))
	r := testRopeKV()
	r.DType = F32
	check(r.pack(&k.specs[kRopeKVF32]))
	r.DType = BF16
	check(r.pack(&k.specs[kRopeKVBF16]))
	p := testBatch()
	check(p.packPrefill(&k.specs[kPrefillAttention], true))
	check(p.packDecode(&k.specs[kDecodeAttention], &k.specs[kDecodeReduce], DecodeSplit{Parts: 4, PartLen: 256}, 0x7000))
	s := Sample{Tokens: 1, Logprobs: 2, TopIDs: 3, TopLogprobs: 4, Logits: 5, Params: 6, Rows: 3, Vocab: 151936, MaxTop: 20}
	check(s.pack(&k.specs[kSample]))
	vd := VerifyDrafts{Accepted: 1, Sampled: 2, Drafts: 3, LogitsStart: 4, Seqs: 5}
	check(vd.pack(&k.specs[kVerifyDrafts]))
	check(packAddBiasBF16(&k.specs[kAddBiasBF16], 1, 2, 7, 6144))
	hn := testHeadNorm()
	check(hn.pack(&k.specs[kHeadRMSNormBF16]))
	packMHCMoE(t, k)
	packQuantLinear(t, k)
}

// testHeadNorm is Qwen3-8B's q/k norm over its fused QKV rows.
func testHeadNorm() HeadRMSNorm {
	return HeadRMSNorm{X: 1, QW: 2, KW: 3, Tokens: 9, Heads: 32, KVHeads: 8, HeadDim: 128, Stride: 48 * 128, Eps: 1e-6}
}

func testRopeKV() RopeKV {
	l, _ := NewKVSlabLayoutOf(BF16, 1<<24, 2*16*8*128*2*2, 1, 16, 8, 128)
	return RopeKV{Q: 1, K: 2, V: 3, Cache: 4, Positions: 5, Slots: 6, Rope: Rope{Cos: 7, Sin: 8, Dim: 128, MaxPos: 4096},
		Layout: l, DType: BF16, Tokens: 9, Heads: 32, KVHeads: 8, HeadDim: 128, QStride: 48 * 128, KVStride: 48 * 128, PageTokens: 16}
}

func testBatch() PagedBatch {
	l, _ := NewKVSlabLayoutOf(BF16, 1<<24, 2*16*8*128*2*2, 1, 16, 8, 128)
	return PagedBatch{Out: 1, Q: 2, KCache: 3, VCache: 3, QueryStart: 4, SeqLens: 5, PageTableStart: 6, PageTable: 7,
		Layout: l, Batch: 3, Tokens: 40, Heads: 32, KVHeads: 8, HeadDim: 128, PageTokens: 16, Scale: 0.088}
}

// TestPackingMatchesSignatures checks every launcher's parameters, kind by kind, against
// the kernel's C signature: a parameter dropped, added or of the wrong width would read
// garbage on the GPU with no error anywhere.
func TestPackingMatchesSignatures(t *testing.T) {
	var k Kernels
	packAll(t, &k)
	for id := range numKernels {
		spec := &k.specs[id]
		n := kernelNames[id]
		if spec.kernel != id {
			t.Errorf("%s: packed as kernel %d", n.entry, spec.kernel)
			continue
		}
		want := signature(t, n.file, n.entry)
		got := spec.args.kinds[:spec.args.n]
		if spec.args.over || len(got) != len(want) {
			t.Errorf("%s: %d parameters packed (overflow %v), the kernel takes %d", n.entry, len(got), spec.args.over, len(want))
			continue
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: parameter %d packed as kind %d, the kernel declares kind %d", n.entry, i, got[i], want[i])
			}
		}
		if spec.block.X == 0 || spec.block.X%32 != 0 || spec.grid.X == 0 || spec.grid.Y == 0 || spec.grid.Z == 0 {
			t.Errorf("%s: grid %+v block %+v", n.entry, spec.grid, spec.block)
		}
		var a cudart.Args
		if spec.args.into(&a).Len() != len(want) {
			t.Errorf("%s: cudart.Args got %d parameters", n.entry, a.Len())
		}
	}
}

// TestPackingAllocatesNothing packs every kernel's launch, and copies it into the
// cudart.Args that Launch reads, without allocating.
func TestPackingAllocatesNothing(t *testing.T) {
	var k Kernels
	if n := testing.AllocsPerRun(100, func() {
		packAll(t, &k)
		for id := range numKernels {
			k.specs[id].args.into(&k.args)
		}
	}); n != 0 {
		t.Errorf("packing every launch allocates %v times", n)
	}
}

func TestPackedValues(t *testing.T) {
	var k Kernels
	packAll(t, &k)
	// Decode: the log-sum-exps follow the partial outputs in the workspace.
	d := &k.specs[kDecodeAttention]
	p := testBatch()
	if d.args.vals[1] != 0x7000 || d.args.vals[2] != 0x7000+4*3*32*4*128 {
		t.Errorf("decode workspace pointers %#x, %#x", d.args.vals[1], d.args.vals[2])
	}
	if want := int64(4*3*32*4*128 + 4*3*32*4); DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, 4) != want {
		t.Errorf("DecodeWorkspaceBytes = %d, want %d", DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, 4), want)
	}
	if DecodeWorkspaceBytes(3, 32, 128, 1) != 0 {
		t.Error("one partition needs no workspace")
	}
	if d.grid != (cudart.Dim3{X: 8, Y: 3, Z: 4}) || k.specs[kDecodeReduce].grid != (cudart.Dim3{X: 32, Y: 3, Z: 1}) {
		t.Errorf("decode grid %+v, reduce grid %+v", d.grid, k.specs[kDecodeReduce].grid)
	}
	// Prefill: 40 tokens over 3 sequences need 40/16 + 3 tiles per head.
	if g := k.specs[kPrefillAttention].grid; g != (cudart.Dim3{X: 5, Y: 32, Z: 1}) {
		t.Errorf("prefill grid %+v", g)
	}
	pf := &k.specs[kPrefillAttention].args
	if pf.vals[15] != 1 || math.Float32frombits(uint32(pf.vals[13])) != 0.088 || pf.vals[16] != 32*128 {
		t.Errorf("prefill skip_decode %d, scale %g, q stride %d", pf.vals[15], math.Float32frombits(uint32(pf.vals[13])), pf.vals[16])
	}
	// Rope: the layout's offsets go last, in bf16 elements.
	r := testRopeKV()
	ra := &k.specs[kRopeKVBF16].args
	if ra.vals[17] != uint64(r.Layout.SlabElems) || ra.vals[20] != uint64(r.Layout.VOffset) || r.Layout.VOffset != 3*16*8*128 {
		t.Errorf("rope layout args %v, layout %+v", ra.vals[17:21], r.Layout)
	}
	if ra.vals[13] != 0 {
		t.Error("NeoX rope packed as GPT-J")
	}
	if b := k.specs[kRopeKVBF16].block.X; b != 512 { // 40 heads × 64 pairs
		t.Errorf("rope block %d", b)
	}
	if s := k.specs[kSample]; s.grid.X != 3 || s.block.X != sampleThreads || s.args.vals[7] != 151936 {
		t.Errorf("sample grid %+v block %+v stride %d", s.grid, s.block, s.args.vals[7])
	}
}

func TestRopeThreads(t *testing.T) {
	for _, c := range []struct{ heads, half, kv, want int }{
		{40, 64, 1024, 512}, {2, 16, 64, 64}, {3, 8, 40, 64}, {5, 20, 90, 128}, {1, 1, 1, 64},
	} {
		if got := ropeThreads(c.heads, c.half, c.kv); got != c.want {
			t.Errorf("ropeThreads(%d, %d, %d) = %d, want %d", c.heads, c.half, c.kv, got, c.want)
		}
	}
}

// prefillTile mirrors flash_attention.cu's mapping of block x to a sequence's query tile:
// the last sequence b with query_start[b]/16 + b <= x, tile x - (query_start[b]/16 + b).
func prefillTile(qs []int32, x int) (b, row0 int, ok bool) {
	lo, hi := 0, len(qs)-2
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if int(qs[mid])/faQueryRows+mid <= x {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	b = lo
	row0 = (x - (int(qs[b])/faQueryRows + b)) * faQueryRows
	return b, row0, row0 >= 0 && row0 < int(qs[b+1]-qs[b])
}

// TestPrefillGridCoversEveryTile checks that the prefill grid of Tokens/16 + Batch blocks
// reaches every 16-row query tile of every sequence exactly once, for ragged batches of
// prompts, chunks and decode rows.
func TestPrefillGridCoversEveryTile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		batch := 1 + r.IntN(40)
		qs := []int32{0}
		for range batch {
			n := 1
			switch r.IntN(4) {
			case 3:
				n = 0 // a graph bucket's padding sequence: no tile
			case 1:
				n = 1 + r.IntN(40)
			case 2:
				n = 1 + r.IntN(700)
			}
			qs = append(qs, qs[len(qs)-1]+int32(n))
		}
		tokens := int(qs[batch])
		seen := map[[2]int]int{}
		for x := range prefillTiles(tokens, batch) {
			if b, row0, ok := prefillTile(qs, x); ok {
				seen[[2]int{b, row0}]++
			}
		}
		for b := range batch {
			n := int(qs[b+1] - qs[b])
			for row0 := 0; row0 < n; row0 += faQueryRows {
				if seen[[2]int{b, row0}] != 1 {
					t.Fatalf("trial %d: sequence %d (%d rows) tile at row %d reached %d times; query_start %v",
						trial, b, n, row0, seen[[2]int{b, row0}], qs)
				}
				delete(seen, [2]int{b, row0})
			}
		}
		if len(seen) != 0 {
			t.Fatalf("trial %d: blocks reached tiles that do not exist: %v", trial, seen)
		}
	}
}

func TestChooseDecodeSplit(t *testing.T) {
	for _, c := range []struct {
		batch, kvHeads, ctx, sms int
		want                     DecodeSplit
	}{
		{1, 8, 32768, 132, DecodeSplit{32, 1024}},    // one long sequence: split for the SMs
		{1, 8, 100, 132, DecodeSplit{1, 128}},        // short context: no split
		{256, 8, 4096, 132, DecodeSplit{1, 4096}},    // a large batch fills the GPU alone
		{4, 8, 8192, 132, DecodeSplit{9, 928}},       // 32 blocks: about 9 partitions
		{1, 1, 1 << 20, 148, DecodeSplit{64, 16384}}, // capped at MaxDecodeParts
		{1, 8, 1000, 132, DecodeSplit{3, 352}},       // no partition under minDecodePart keys
	} {
		got, err := ChooseDecodeSplit(c.batch, c.kvHeads, c.ctx, c.sms)
		if err != nil || got != c.want {
			t.Errorf("ChooseDecodeSplit(%d, %d, %d, %d) = %+v, %v; want %+v", c.batch, c.kvHeads, c.ctx, c.sms, got, err, c.want)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		batch, kv, ctx, sms := 1+r.IntN(300), 1+r.IntN(16), 1+r.IntN(1<<18), 1+r.IntN(200)
		s, err := ChooseDecodeSplit(batch, kv, ctx, sms)
		switch {
		case err != nil:
			t.Fatal(err)
		case s.Parts < 1 || s.Parts > MaxDecodeParts || s.PartLen%faKeys != 0:
			t.Fatalf("(%d, %d, %d, %d): %+v out of the kernel's limits", batch, kv, ctx, sms, s)
		case s.Parts*s.PartLen < ctx || (s.Parts-1)*s.PartLen >= ctx:
			t.Fatalf("(%d, %d, %d, %d): %+v does not cut %d keys into non-empty partitions", batch, kv, ctx, sms, s, ctx)
		case s.Parts > 1 && s.PartLen < minDecodePart:
			t.Fatalf("(%d, %d, %d, %d): %+v partitions shorter than %d keys", batch, kv, ctx, sms, s, minDecodePart)
		}
	}
	if _, err := ChooseDecodeSplit(1, 8, 0, 132); err == nil {
		t.Error("a zero context gave no error")
	}
}

func TestLauncherShapeErrors(t *testing.T) {
	var spec, red launchSpec
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"rows 0", packAddRMSNorm(&spec, BF16, 1, 2, 3, 4, 0, 8, 1e-6), "positive"},
		{"dtype", packAddRMSNorm(&spec, 0, 1, 2, 3, 4, 1, 8, 1e-6), "element type"},
		{"rotary odd", func() error { r := testRopeKV(); r.Rope.Dim = 63; return r.pack(&spec) }(), "rotary dim"},
		{"rope heads", func() error { r := testRopeKV(); r.Heads = 30; return r.pack(&spec) }(), "multiple"},
		{"rope stride", func() error { r := testRopeKV(); r.QStride = 100; return r.pack(&spec) }(), "stride"},
		{"rope layout", func() error { r := testRopeKV(); r.Layout = KVSlabLayout{}; return r.pack(&spec) }(), "KVSlabLayout"},
		{"attn head dim", func() error { p := testBatch(); p.HeadDim = 512; return p.packPrefill(&spec, false) }(), "head dim"},
		{"attn odd dim", func() error { p := testBatch(); p.HeadDim = 127; return p.packPrefill(&spec, false) }(), "even"},
		{"attn batch", func() error { p := testBatch(); p.Batch = 1 << 16; return p.packPrefill(&spec, false) }(), "below 65536"},
		{"attn odd offset", func() error { p := testBatch(); p.Layout.KOffset++; return p.packPrefill(&spec, false) }(), "even"},
		{"decode group", func() error { p := testBatch(); p.KVHeads = 1; return p.packDecode(&spec, &red, DecodeSplit{1, 32}, 0) }(), "exceed 16"},
		{"decode parts", func() error { p := testBatch(); return p.packDecode(&spec, &red, DecodeSplit{65, 32}, 1) }(), "partitions"},
		{"decode tile", func() error { p := testBatch(); return p.packDecode(&spec, &red, DecodeSplit{2, 100}, 1) }(), "multiple of 32"},
		{"decode workspace", func() error { p := testBatch(); return p.packDecode(&spec, &red, DecodeSplit{2, 256}, 0) }(), "workspace of"},
		{"sample top", (&Sample{Tokens: 1, Logprobs: 1, Logits: 1, Params: 1, Rows: 1, Vocab: 10, MaxTop: 40}).pack(&spec), "top-n capacity"},
		{"sample stride", (&Sample{Tokens: 1, Logprobs: 1, Logits: 1, Params: 1, Rows: 1, Vocab: 10, LogitsStride: 5}).pack(&spec), "stride"},
		{"bias rows", packAddBiasBF16(&spec, 1, 2, 0, 8), "positive"},
		{"head norm dim", func() error { n := testHeadNorm(); n.HeadDim = 512; return n.pack(&spec) }(), "head dim"},
		{"head norm stride", func() error { n := testHeadNorm(); n.Stride = 32 * 128; return n.pack(&spec) }(), "stride"},
		{"head norm heads", func() error { n := testHeadNorm(); n.KVHeads = 0; return n.pack(&spec) }(), "positive"},
		{"sample outputs", (&Sample{Rows: 1, Vocab: 10}).pack(&spec), "must all be set"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, c.err, c.want)
		}
	}
}

// TestSampleParamsLayout checks PutSampleParams against the C struct sampling.cu reads:
// its fields in order, each at the offset its type's alignment gives.
func TestSampleParamsLayout(t *testing.T) {
	src, _ := files.ReadFile("sampling.cu")
	m := regexp.MustCompile(`(?s)struct resin_sample_params \{(.*?)\};`).FindSubmatch(src)
	if m == nil {
		t.Fatal("sampling.cu defines no struct resin_sample_params")
	}
	var fields []string
	off := 0
	offsets := map[string]int{}
	for _, line := range strings.Split(string(m[1]), "\n") {
		line = strings.TrimSpace(strings.SplitN(line, "//", 2)[0])
		if line == "" {
			continue
		}
		decl := strings.TrimSuffix(line, ";")
		name := decl[strings.LastIndex(decl, " ")+1:]
		size := 4
		if strings.HasPrefix(decl, "unsigned long long ") {
			size = 8
		}
		off = (off + size - 1) / size * size
		offsets[name] = off
		fields = append(fields, name)
		off += size
	}
	if off != SampleParamsBytes {
		t.Fatalf("the C struct is %d bytes, SampleParamsBytes %d", off, SampleParamsBytes)
	}
	want := []string{"temperature", "top_p", "min_p", "top_k", "seed", "pos", "logprobs"}
	if strings.Join(fields, ",") != strings.Join(want, ",") {
		t.Fatalf("C fields %v, the encoder writes %v", fields, want)
	}
	p := SampleParams{Temperature: 0.7, TopP: 0.9, MinP: 0.05, TopK: 50, Seed: 0x0123456789abcdef, Pos: 1234, Logprobs: 5}
	buf := make([]byte, 2*SampleParamsBytes)
	n, err := PutSampleParams(buf, []SampleParams{{}, p})
	if err != nil || n != 2*SampleParamsBytes {
		t.Fatalf("PutSampleParams = %d, %v", n, err)
	}
	b := buf[SampleParamsBytes:]
	le := binary.LittleEndian
	f32 := func(name string) float32 { return math.Float32frombits(le.Uint32(b[offsets[name]:])) }
	if f32("temperature") != 0.7 || f32("top_p") != 0.9 || f32("min_p") != 0.05 || int32(le.Uint32(b[offsets["top_k"]:])) != 50 ||
		le.Uint64(b[offsets["seed"]:]) != p.Seed || int32(le.Uint32(b[offsets["pos"]:])) != 1234 || int32(le.Uint32(b[offsets["logprobs"]:])) != 5 {
		t.Errorf("encoded row % x does not read back as %+v", b, p)
	}
	if _, err := PutSampleParams(buf[:10], []SampleParams{p}); err == nil {
		t.Error("a short buffer gave no error")
	}
	if n := testing.AllocsPerRun(100, func() { PutSampleParams(buf, []SampleParams{p, p}) }); n != 0 {
		t.Errorf("PutSampleParams allocates %v times", n)
	}
	for _, bad := range []SampleParams{{Temperature: -1}, {TopP: 1.5}, {MinP: -0.1}, {TopK: -2}, {Pos: -1}, {Logprobs: 33},
		{Temperature: float32(math.NaN())}} {
		if bad.Check() == nil {
			t.Errorf("%+v: Check gave no error", bad)
		}
	}
	if p.Check() != nil {
		t.Errorf("%+v: %v", p, p.Check())
	}
}

func TestNewKVSlabLayoutBF16(t *testing.T) {
	// Two layers of 16 tokens × 8 kv heads × 128 dims, keys then values, in bf16.
	page := int64(2 * 2 * 16 * 8 * 128 * 2)
	l, err := NewKVSlabLayoutOf(BF16, 64*page, page, 1, 16, 8, 128)
	if err != nil {
		t.Fatal(err)
	}
	if l.PageElems != page/2 || l.SlabElems != 32*page || l.KOffset != 2*16*8*128 || l.VOffset != 3*16*8*128 {
		t.Errorf("layout %+v", l)
	}
	if _, err := NewKVSlabLayoutOf(BF16, 64*page, page, 2, 16, 8, 128); err == nil {
		t.Error("a third layer fit a two-layer page")
	}
	if _, err := NewKVSlabLayoutOf(BF16, 64*page, page+1, 0, 16, 8, 128); err == nil {
		t.Error("an odd page size gave no error")
	}
	f, _ := NewKVSlabLayout(64*page, page, 1, 16, 8, 64)
	if f.PageElems != page/4 {
		t.Errorf("float32 layout %+v", f)
	}
}

// BenchmarkPackLaunches is the host-side cost of one launch of every new kernel (eleven
// launches: checks, geometry, parameters and their copy into cudart.Args), the part of
// a step's kernel launches that runs before the driver call.
func BenchmarkPackLaunches(b *testing.B) {
	var k Kernels
	b.ReportAllocs()
	for b.Loop() {
		packAll(b, &k)
		for id := range numKernels {
			k.specs[id].args.into(&k.args)
		}
	}
}
