package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emu"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// The emulator's self-test: a kernel source with one barrier removed must be caught (a
// launch error, outputs that differ between schedules, or outputs off the reference).
// Each case below is a small version of a kernel's test above, written against a
// testing.TB so that it can run under a catcher that records a failure instead of failing.

// emuOverride replaces a source's module for the launches of a mutation check (the
// package's tests run one at a time).
var emuOverride = map[string]*emu.Module{}

// catcher is a testing.TB whose failures are recorded, not reported: Fatal ends the
// goroutine running the case.
type catcher struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (c *catcher) Helper() {}
func (c *catcher) Errorf(format string, args ...any) {
	c.mu.Lock()
	c.failed = append(c.failed, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}
func (c *catcher) Error(args ...any)                 { c.Errorf("%s", fmt.Sprint(args...)) }
func (c *catcher) Fatalf(format string, args ...any) { c.Errorf(format, args...); runtime.Goexit() }
func (c *catcher) Fatal(args ...any)                 { c.Error(args...); runtime.Goexit() }
func (c *catcher) Logf(string, ...any)               {}
func (c *catcher) Log(...any)                        {}

// catch runs fn under a catcher and returns what it recorded.
func catch(t testing.TB, fn func(tb testing.TB)) []string {
	c := &catcher{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(c)
	}()
	<-done
	return c.failed
}

// barrierCases is a small check per source that has barriers.
var barrierCases = map[string]func(t testing.TB){
	"softmax.cu": func(t testing.TB) {
		const rows, n = 2, 1000
		x := emuRnd(1, rows*n, 6)
		want := append([]float32(nil), x...)
		ref.Softmax(want, rows, n)
		m := &emuMem{t: t}
		xd := m.f32(x)
		emuRun(t, "softmax", m, launchSoftmax(xd, rows, n))
		emuClose(t, "softmax", m.getF32(xd, rows*n), want, 1e-6)
	},
	"rmsnorm.cu": func(t testing.TB) {
		const rows, dim = 2, 1000
		x, w := emuRnd(2, rows*dim, 3), emuRnd(3, dim, 1)
		want := make([]float32, rows*dim)
		ref.RMSNorm(want, x, w, rows, dim, 1e-6)
		m := &emuMem{t: t}
		out := m.alloc(4 * rows * dim)
		emuRun(t, "rmsnorm", m, launchRMSNorm(out, m.f32(x), m.f32(w), rows, dim, 1e-6))
		emuClose(t, "rmsnorm", m.getF32(out, rows*dim), want, 2e-6)
	},
	"argmax.cu": func(t testing.TB) {
		const rows, n = 3, 1001
		x := emuRnd(4, rows*n, 5)
		want := make([]int32, rows)
		ref.ArgmaxRows(want, x, rows, n)
		m := &emuMem{t: t}
		out := m.alloc(4 * rows)
		emuRun(t, "argmax", m, launchArgmax(out, m.f32(x), rows, n))
		if got := m.getI32(out, rows); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("argmax %v, ref %v", got, want)
		}
	},
	"moe_topk.cu": func(t testing.TB) {
		const tokens, experts = 3, 64
		r := ref.Routing{TopK: 6, Scoring: ref.ScoreSigmoid, Renormalize: true, Groups: 8, GroupTopK: 3, Bias: emuRnd(5, experts, 0.1)}
		logits := emuRnd(6, tokens*experts, 3)
		wantW, wantID := make([]float32, tokens*r.TopK), make([]int32, tokens*r.TopK)
		ref.MoETopK(wantW, wantID, logits, tokens, experts, r)
		m := &emuMem{t: t}
		w, ids := m.alloc(4*len(wantW)), m.alloc(4*len(wantID))
		emuRun(t, "moe", m, launchMoETopK(MoERouting{Weights: w, IDs: ids, Logits: m.f32(logits), Bias: m.f32(r.Bias), Tokens: tokens,
			Experts: experts, TopK: r.TopK, Scoring: r.Scoring, Renormalize: true, Groups: r.Groups, GroupTopK: r.GroupTopK}))
		if got := m.getI32(ids, len(wantID)); fmt.Sprint(got) != fmt.Sprint(wantID) {
			t.Fatalf("moe ids %v, ref %v", got, wantID)
		}
		emuClose(t, "moe", m.getF32(w, len(wantW)), wantW, 2e-6)
	},
	"paged_attention.cu": func(t testing.TB) {
		m := &emuMem{t: t}
		l, out, want := f32Attention(t, m, 4, 2, 64, 2, 0, []int{600, 40}, true)
		emuRun(t, "paged attention", m, l)
		emuClose(t, "paged attention", m.getF32(out, len(want)), want, 2e-5)
	},
	"flash_attention.cu": func(t testing.TB) {
		c := newEmuCache(7, BF16, 1, 0, 16, 2, 64, 8, 2)
		scale := float32(0.125)
		b := newEmuBatch(t, c, []emuSeq{{40, 30}, {90, 1}, {0, 1}}, 4, scale, 0, 8)
		m := &emuMem{t: t}
		p := b.upload(m, c, 4, scale, 0)
		var pre, dec, red launchSpec
		if err := firstErrOf(p.packPrefill(&pre, true), p.packDecode(&dec, &red, DecodeSplit{2, 64}, m.alloc(int(DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, 2))))); err != nil {
			t.Fatal(err)
		}
		emuRun(t, "attention", m, fromSpec(&pre), fromSpec(&dec), fromSpec(&red))
		emuClose(t, "attention", m.getBF16(p.Out, len(b.want)), b.want, emuBF16Tol)
	},
	"sampling.cu": func(t testing.TB) {
		const vocab = 700
		params := []SampleParams{{Temperature: 0, Logprobs: 4}, {Temperature: 0.9, TopK: 30, TopP: 0.8, Seed: 1, Pos: 2, Logprobs: 3},
			{Temperature: 1.1, MinP: 0.05, Seed: 2, Pos: 3}, {Temperature: 0, Logprobs: 3}}
		logits := emuRnd(9, len(params)*vocab, 6)
		for i := 3 * vocab; i < 4*vocab; i++ { // a row of NaN
			logits[i] = float32(math.NaN())
		}
		got := emuSample(t, "sample", logits, vocab, vocab, params)
		checkAgainstCPU(t, "sample", got, logits, vocab, vocab, params[:3])
		if nan := got.topIDs[3*MaxSampleTop : 3*MaxSampleTop+4]; got.tokens[3] != 0 || fmt.Sprint(nan) != "[0 1 2 -1]" {
			t.Fatalf("the NaN row: token %d, alternatives %v", got.tokens[3], nan)
		}
	},
}

func firstErrOf(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// syncSites returns the byte offsets of every resin_sync(); in src at or after from.
func syncSites(src string, from int) []int {
	var at []int
	for i := from; ; {
		j := strings.Index(src[i:], "resin_sync();")
		if j < 0 {
			return at
		}
		at = append(at, i+j)
		i += j + 1
	}
}

// mutationCaught builds file's source with the barrier at byte off removed and reports
// what its case recorded (nothing: the removal went unnoticed).
func mutationCaught(t *testing.T, file, src string, off int) []string {
	t.Helper()
	mutated := src[:off] + "/* barrier removed */" + src[off+len("resin_sync();"):]
	p, err := emu.Build(mutated, "mutant_"+file)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := emu.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	emuOverride[file] = mod
	defer delete(emuOverride, file)
	return catch(t, barrierCases[file])
}

// redundantBarriers are the barriers whose removal the full sweep (RESIN_EMU_MUTATE=all)
// does not notice, each with why no thread can race across it.
var redundantBarriers = map[string]string{
	"moe_topk.cu: if ((int)lane < groups && !keep)": "between it and the barrier before, each lane reads and writes only its own group's experts",
	"sampling.cu: if (bin < 0) {":                   "result[] is written again only by thread 0 after the next pass's first two barriers",
	"sampling.cu: if (lane == 0) {":                 "resin_block_argmax is sampling's first use of sv and si",
	"softmax.cu: if (lane == 0) scratch[warp] = v;": "resin_block_max is softmax's first use of its scratch (the barrier guards a reduction before)",
}

// TestEmuMissingBarrierCaught removes, one at a time, barriers of the kernels and of the
// prelude's block reductions, and checks that each removal is caught. By default a
// representative set runs; RESIN_EMU_MUTATE=all removes every barrier of every source in
// turn (and of the prelude, through softmax): all are caught but redundantBarriers.
func TestEmuMissingBarrierCaught(t *testing.T) {
	emuKernels(t)
	// The unmutated cases pass: what the mutants fail is the removal.
	for file, fn := range barrierCases {
		if failed := catch(t, fn); len(failed) > 0 {
			t.Fatalf("%s: the unmutated case fails: %v", file, failed)
		}
	}
	type site struct{ file, near string }
	sites := []site{
		{"softmax.cu", "resin_sync();  // scratch may still be read by a previous reduction"},
		{"rmsnorm.cu", "resin_sync();\n  v = lane < warps ? scratch[lane] : 0.0f;"},
		{"flash_attention.cu", "resin_sync();  // the previous tile is consumed"},
		{"flash_attention.cu", "resin_sync();\n    resin_fa_attend(ks, vs, qsm, warp, RESIN_FA_THREADS"},
		{"sampling.cu", "resin_sync();\n    for (int i = RESIN_TID_X; i < s.vocab; i += RESIN_NTID_X) {"},
		{"argmax.cu", "resin_sync();\n  if (warp == 0) {"},
	}
	all := os.Getenv("RESIN_EMU_MUTATE") == "all"
	var offs []struct {
		file string
		off  int
	}
	for _, s := range sites {
		src, err := Source(s.file)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(src, s.near)
		if i < 0 || strings.Count(src, s.near) != 1 {
			t.Fatalf("%s: the barrier before %q is not found once", s.file, s.near)
		}
		if !all {
			offs = append(offs, struct {
				file string
				off  int
			}{s.file, i})
		}
	}
	if all {
		for _, file := range Names() {
			if barrierCases[file] == nil {
				continue
			}
			src, _ := Source(file)
			from := strings.Index(src, "#endif  // RESIN_PRELUDE") // the file's own barriers
			if file == "softmax.cu" {
				from = 0 // and, through softmax, the prelude's
			}
			for _, off := range syncSites(src, from) {
				offs = append(offs, struct {
					file string
					off  int
				}{file, off})
			}
		}
	}
	for _, o := range offs {
		src, _ := Source(o.file)
		// Name the barrier by the line after it (the inlined source's line numbers are
		// not the file's).
		rest := src[o.off+len("resin_sync();"):]
		if i := strings.IndexByte(rest, '\n'); i >= 0 {
			rest = rest[i+1:]
		}
		next, _, _ := strings.Cut(rest, "\n")
		failed := mutationCaught(t, o.file, src, o.off)
		if len(failed) == 0 {
			if why, ok := redundantBarriers[o.file+": "+strings.TrimSpace(next)]; ok {
				t.Logf("%s: the barrier before %q is redundant: %s", o.file, strings.TrimSpace(next), why)
				continue
			}
			t.Errorf("%s: removing the barrier before %q went unnoticed", o.file, strings.TrimSpace(next))
			continue
		}
		t.Logf("%s: the barrier before %q removed: %s", o.file, strings.TrimSpace(next), failed[0])
	}
}

// TestEmuSanitizers runs a quick subset of the kernels under AddressSanitizer and UBSan,
// in a process of their own (emu.BuildProgram), each buffer allocated at its exact size:
// the row kernels' tails, attention's page reads and sampling's selections. It skips
// where the sanitizers' runtimes are not installed.
func TestEmuSanitizers(t *testing.T) {
	emuKernels(t)
	if testing.Short() {
		t.Skip("sanitizer builds: not in -short")
	}
	run := func(file string, m *emuMem, launches ...emuLaunch) {
		t.Helper()
		src, err := Source(file)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := emu.BuildProgram(src, file, true)
		if err != nil {
			if !errors.Is(err, emu.ErrNoSanitizer) {
				t.Fatal(err)
			}
			t.Skipf("no sanitizer build here: %v", err)
		}
		// The in-process result, then the same launches in the sanitized process.
		before := m.snapshot()
		emuRun(t, file, m, launches...)
		want := m.snapshot()
		var s emu.Script
		bases := make([]cudart.DevicePtr, len(m.bufs))
		for i, b := range m.bufs {
			s.Buffer(before[i])
			bases[i] = cudart.DevicePtr(uintptrOf(b.data))
		}
		for _, l := range launches {
			var args []emu.Arg
			for i := range l.args.n {
				v := l.args.vals[i]
				if l.args.kinds[i] != argPtr || v == 0 {
					args = append(args, emu.Value(v))
					continue
				}
				found := false
				for bi, base := range bases {
					if p := cudart.DevicePtr(v); p >= base && p < base+cudart.DevicePtr(len(m.bufs[bi].data)) {
						args = append(args, emu.BufferAt(bi, int64(p-base)))
						found = true
					}
				}
				if !found {
					t.Fatalf("%s: parameter %d points into no buffer", l.entry, i)
				}
			}
			s.Launch(l.entry, [3]uint32{l.grid.X, l.grid.Y, l.grid.Z}, [3]uint32{l.block.X, l.block.Y, l.block.Z},
				uint32(l.shared), emu.Random, 3, args...)
		}
		got, err := emu.RunScript(prog, &s)
		if err != nil {
			t.Fatalf("%s under the sanitizers: %v", file, err)
		}
		for i := range got {
			if string(got[i]) != string(want[i]) {
				t.Fatalf("%s: buffer %d differs between the sanitized process and this one", file, i)
			}
		}
	}
	{ // a row kernel with a tail
		const rows, dim = 3, 333
		m := &emuMem{t: t}
		out := m.alloc(4 * rows * dim)
		run("rmsnorm.cu", m, launchRMSNorm(out, m.f32(emuRnd(1, rows*dim, 2)), m.f32(emuRnd(2, dim, 1)), rows, dim, 1e-6))
	}
	{ // attention over pages in two slabs, a chunk on cached pages and decode rows
		c := newEmuCache(7, BF16, 1, 0, 16, 2, 64, 8, 2)
		b := newEmuBatch(t, c, []emuSeq{{40, 30}, {90, 1}, {0, 1}}, 4, 0.125, 0, 8)
		m := &emuMem{t: t}
		p := b.upload(m, c, 4, 0.125, 0)
		var pre, dec, red launchSpec
		if err := firstErrOf(p.packPrefill(&pre, true), p.packDecode(&dec, &red, DecodeSplit{2, 64}, m.alloc(int(DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, 2))))); err != nil {
			t.Fatal(err)
		}
		run("flash_attention.cu", m, fromSpec(&pre), fromSpec(&dec), fromSpec(&red))
	}
	{ // sampling with a stride, top-k, top-p and alternatives
		const vocab = 501
		params := []SampleParams{{Temperature: 0, Logprobs: 4}, {Temperature: 0.9, TopK: 30, TopP: 0.8, Seed: 1, Pos: 2, Logprobs: 32}}
		buf := make([]byte, len(params)*SampleParamsBytes)
		PutSampleParams(buf, params)
		m := &emuMem{t: t}
		sp := Sample{Tokens: m.alloc(8), Logprobs: m.alloc(8), TopIDs: m.alloc(8 * MaxSampleTop), TopLogprobs: m.alloc(8 * MaxSampleTop),
			Logits: m.f32(emuRnd(3, 2*vocab+1, 5)), Params: m.bytes(buf), Rows: 2, Vocab: vocab, LogitsStride: vocab + 1, MaxTop: MaxSampleTop}
		var spec launchSpec
		if err := sp.pack(&spec); err != nil {
			t.Fatal(err)
		}
		run("sampling.cu", m, fromSpec(&spec))
	}
	{ // paged attention and top-k routing
		m := &emuMem{t: t}
		l, _, _ := f32Attention(t, m, 4, 2, 80, 2, 30, []int{100, 3}, true)
		run("paged_attention.cu", m, l)
		m2 := &emuMem{t: t}
		w, ids := m2.alloc(4*3*4), m2.alloc(4*3*4)
		run("moe_topk.cu", m2, launchMoETopK(MoERouting{Weights: w, IDs: ids, Logits: m2.f32(emuRnd(4, 3*60, 2)), Tokens: 3, Experts: 60, TopK: 4, Scoring: ref.ScoreSoftmax}))
	}
}

// TestEmuGuardsCatchOverrun: a launch that writes past its output buffer (one row more
// than the buffer holds) fails the emulated run.
func TestEmuGuardsCatchOverrun(t *testing.T) {
	emuKernels(t)
	failed := catch(t, func(tb testing.TB) {
		const rows, dim = 3, 8
		m := &emuMem{t: tb}
		out := m.alloc(4 * (rows - 1) * dim)
		emuRun(tb, "rmsnorm overrun", m, launchRMSNorm(out, m.f32(emuRnd(1, rows*dim, 1)), m.f32(emuRnd(2, dim, 1)), rows, dim, 1e-6))
	})
	if len(failed) == 0 || !strings.Contains(failed[0], "past the end of buffer 0") {
		t.Errorf("an overrun: %v", failed)
	}
}
