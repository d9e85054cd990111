package cuda

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emu"
	"github.com/resin-llm/resin/core/weights"
)

// The kernels run on the emulated device (core/cudart/emu): each .cu file as Source()
// gives it to NVRTC, compiled for the host, launched with the parameters the production
// launchers pack (launchSpec, or the same calls as the older launchers make), on host
// memory standing in for device memory. Every launch runs under the four schedules and
// must leave every buffer bit-identical under each.

// emuModules builds and opens every kernel source once per test binary.
var emuModules = sync.OnceValues(func() (map[string]*emu.Module, error) {
	if err := emu.Available(); err != nil {
		return nil, err
	}
	// Built a few at a time (g++ is the cold start's cost), opened in order.
	names := Names()
	paths, errs := make([]string, len(names)), make([]error, len(names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, min(4, runtime.NumCPU()))
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			src, err := Source(name)
			if err == nil {
				paths[i], err = emu.Build(src, name)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	mods := map[string]*emu.Module{}
	for i, name := range names {
		if errs[i] == nil {
			mods[name], errs[i] = emu.Open(paths[i])
		}
		if errs[i] != nil { // only the launches of this source fail (TestEmuEverySourceBuilds names it)
			emuBuildErrs[name] = errs[i]
			delete(mods, name)
		}
	}
	return mods, nil
})

// emuBuildErrs holds the sources that did not build or load, with why.
var emuBuildErrs = map[string]error{}

// TestEmuEverySourceBuilds: every kernel source compiles for the emulated device.
func TestEmuEverySourceBuilds(t *testing.T) {
	emuKernels(t)
	for _, name := range Names() {
		if err := emuBuildErrs[name]; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// emuStart is when the first emulated test began, for the summary TestMain prints.
var (
	emuStartOnce sync.Once
	emuStart     time.Time
	emuTime      time.Duration
	emuTimeMu    sync.Mutex
)

// emuKernels returns the modules, skipping the test (naming the compiler) without g++.
func emuKernels(t testing.TB) map[string]*emu.Module {
	t.Helper()
	if err := emu.Available(); err != nil {
		t.Skipf("no emulated device: %v", err)
	}
	emuStartOnce.Do(func() { emuStart = time.Now() })
	mods, err := emuModules()
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

// emuLaunched records the kernel entry points launched on the emulated device.
var emuLaunched sync.Map

// emuCovered are the kernel entry points the emulated tests launch. When every test ran,
// TestMain fails the run if one of them was not launched, and warns about entry points
// of sources added since (they want a test here).
var emuCovered = map[string]bool{}

func init() {
	for _, e := range []string{
		"add_rmsnorm.cu:resin_add_rmsnorm_bf16", "add_rmsnorm.cu:resin_add_rmsnorm_f32", "add_rmsnorm.cu:resin_rmsnorm_bf16",
		"argmax.cu:resin_argmax", "bias_headnorm.cu:resin_add_bias_bf16", "bias_headnorm.cu:resin_head_rmsnorm_bf16",
		"embedding.cu:resin_embedding", "embedding.cu:resin_embedding_bf16", "flash_attention.cu:resin_decode_attention_bf16",
		"flash_attention.cu:resin_decode_reduce_bf16", "flash_attention.cu:resin_prefill_attention_bf16",
		"moe_topk.cu:resin_moe_topk", "paged_attention.cu:resin_paged_attention", "rmsnorm.cu:resin_rmsnorm",
		"rope_kv.cu:resin_rope_kv_bf16", "rope_kv.cu:resin_rope_kv_f32", "rotary.cu:resin_rope_interleaved",
		"rotary.cu:resin_rope_neox", "sampling.cu:resin_sample", "silu_mul.cu:resin_silu_mul", "silu_mul.cu:resin_silu_mul_bf16",
		"silu_mul.cu:resin_silu_mul_split", "softmax.cu:resin_softmax",
		"mhc.cu:resin_mhc_pre_f32", "mhc.cu:resin_mhc_post_f32", "moe_masked.cu:resin_moe_route_f32",
		"moe_masked.cu:resin_moe_masked_layout", "moe_masked.cu:resin_moe_gather_f32",
		"moe_masked.cu:resin_swiglu_clamped_f32", "moe_masked.cu:resin_moe_combine_f32",
		"quant_linear.cu:resin_fp8_quant_f32", "quant_linear.cu:resin_fp8_quant_bf16",
		"quant_linear.cu:resin_fp8_block_gemm_f32", "quant_linear.cu:resin_fp8_block_gemm_bf16",
		"quant_linear.cu:resin_mxfp4_gemm_f32", "quant_linear.cu:resin_mxfp4_gemm_bf16", "quant_linear.cu:resin_cast_bf16",
		"verify.cu:resin_verify_drafts",
	} {
		emuCovered[e] = true
	}
}

// TestMain prints the emulated run's time and counts and checks emuCovered.
func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if !emuStart.IsZero() {
		line := fmt.Sprintf("core/kernels/cuda emulated kernels: %v launching (%v since the first build), %v",
			emuTime.Round(time.Millisecond), time.Since(emuStart).Round(time.Millisecond), emu.Stats())
		fmt.Println(line)
		if err := emu.Report(line); err != nil {
			fmt.Println(err)
		}
		run, skip := flag.Lookup("test.run"), flag.Lookup("test.skip")
		if code == 0 && run != nil && run.Value.String() == "" && (skip == nil || skip.Value.String() == "") {
			var missing, untested []string
			for _, e := range emuEntries(nil) {
				if _, ok := emuLaunched.Load(e); !ok {
					if emuCovered[e] {
						missing = append(missing, e)
					} else {
						untested = append(untested, e)
					}
				}
			}
			if len(untested) > 0 {
				line := fmt.Sprintf("warning: kernel entry points without an emulated test: %v", untested)
				fmt.Println(line)
				emu.Report("core/kernels/cuda " + line)
			}
			if len(missing) > 0 {
				fmt.Printf("FAIL: kernel entry points the emulated tests cover did not run: %v\n", missing)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// emuMem is host memory handed to kernels as device addresses. Each buffer sits on the
// Go heap (it never moves) and starts on 64 bytes, as cudaMalloc's do, between guard
// bytes that every emulated run checks (a write out of bounds fails the test).
type emuMem struct {
	t    testing.TB
	bufs []emuBuf
}

type emuBuf struct {
	raw  []byte // keeps the allocation alive
	data []byte // the aligned part handed out
}

// alloc returns n bytes filled with 0xFF (NaN as float32 and bf16, -1 as an integer),
// as device memory nobody wrote: an output element a kernel fails to write shows.
func (m *emuMem) alloc(n int) cudart.DevicePtr {
	p := m.zeros(n)
	for i := range m.bufs[len(m.bufs)-1].data {
		m.bufs[len(m.bufs)-1].data[i] = 0xFF
	}
	return p
}

// emuGuard is the bytes before and after each buffer that no kernel may write.
const (
	emuGuard     = 64
	emuGuardByte = 0xA5
)

// zeros returns n zeroed bytes.
func (m *emuMem) zeros(n int) cudart.DevicePtr {
	n = max(n, 4)
	raw := make([]byte, n+3*emuGuard)
	off := emuGuard + int((64-uintptr(unsafe.Pointer(&raw[0]))%64)%64)
	for i := range raw {
		raw[i] = emuGuardByte
	}
	b := emuBuf{raw: raw, data: raw[off : off+n : off+n]}
	clear(b.data)
	m.bufs = append(m.bufs, b)
	return cudart.DevicePtr(uintptr(unsafe.Pointer(&b.data[0])))
}

// checkGuards fails when a kernel wrote into the guard bytes around a buffer.
func (m *emuMem) checkGuards(name string) {
	for i, b := range m.bufs {
		off := int(uintptr(unsafe.Pointer(&b.data[0])) - uintptr(unsafe.Pointer(&b.raw[0])))
		for j, v := range b.raw[off-emuGuard : off] {
			if v != emuGuardByte {
				m.t.Fatalf("%s: a kernel wrote %d bytes before buffer %d", name, emuGuard-j, i)
			}
		}
		for j, v := range b.raw[off+len(b.data) : off+len(b.data)+emuGuard] {
			if v != emuGuardByte {
				m.t.Fatalf("%s: a kernel wrote %d bytes past the end of buffer %d (%d bytes)", name, j+1, i, len(b.data))
			}
		}
	}
}

// find returns the bytes of the buffer holding p, from p on.
func (m *emuMem) find(p cudart.DevicePtr) []byte {
	for _, b := range m.bufs {
		base := cudart.DevicePtr(uintptr(unsafe.Pointer(&b.data[0])))
		if p >= base && p < base+cudart.DevicePtr(len(b.data)) {
			return b.data[p-base:]
		}
	}
	m.t.Fatalf("address %#x is in no buffer", uint64(p))
	return nil
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func (m *emuMem) put(p cudart.DevicePtr, v any) {
	var w bytes.Buffer
	if err := binary.Write(&w, binary.LittleEndian, v); err != nil {
		m.t.Fatal(err)
	}
	copy(m.find(p), w.Bytes())
}

func (m *emuMem) get(p cudart.DevicePtr, v any) {
	if err := binary.Read(bytes.NewReader(m.find(p)), binary.LittleEndian, v); err != nil {
		m.t.Fatal(err)
	}
}

func (m *emuMem) f32(h []float32) cudart.DevicePtr {
	p := m.zeros(4 * len(h))
	m.put(p, h)
	return p
}
func (m *emuMem) i32(h []int32) cudart.DevicePtr {
	p := m.zeros(4 * len(h))
	m.put(p, h)
	return p
}
func (m *emuMem) u32(h []uint32) cudart.DevicePtr {
	p := m.zeros(4 * len(h))
	m.put(p, h)
	return p
}
func (m *emuMem) i64(h []int64) cudart.DevicePtr {
	p := m.zeros(8 * len(h))
	m.put(p, h)
	return p
}
func (m *emuMem) bf16(h []uint16) cudart.DevicePtr {
	p := m.zeros(2 * len(h))
	m.put(p, h)
	return p
}
func (m *emuMem) bytes(h []byte) cudart.DevicePtr {
	p := m.zeros(len(h))
	copy(m.find(p), h)
	return p
}

func (m *emuMem) getF32(p cudart.DevicePtr, n int) []float32 {
	out := make([]float32, n)
	m.get(p, out)
	return out
}
func (m *emuMem) getI32(p cudart.DevicePtr, n int) []int32 {
	out := make([]int32, n)
	m.get(p, out)
	return out
}
func (m *emuMem) getBF16(p cudart.DevicePtr, n int) []float32 {
	h := make([]uint16, n)
	m.get(p, h)
	out := make([]float32, n)
	for i, v := range h {
		out[i] = weights.BF16ToFloat32(v)
	}
	return out
}

func (m *emuMem) snapshot() [][]byte {
	s := make([][]byte, len(m.bufs))
	for i, b := range m.bufs {
		s[i] = append([]byte(nil), b.data...)
	}
	return s
}

func (m *emuMem) restore(s [][]byte) {
	for i, b := range m.bufs {
		copy(b.data, s[i])
	}
}

// emuLaunch is one kernel launch on the emulated device.
type emuLaunch struct {
	file, entry string
	grid, block cudart.Dim3
	shared      int
	args        argBuf
}

// fromSpec is the launch a production launcher built.
func fromSpec(spec *launchSpec) emuLaunch {
	n := kernelNames[spec.kernel]
	return emuLaunch{n.file, n.entry, spec.grid, spec.block, spec.shared, spec.args}
}

func (l *emuLaunch) run(t testing.TB, sched emu.Schedule, seed uint64) error {
	mods := emuKernels(t)
	m := mods[l.file]
	if o := emuOverride[l.file]; o != nil {
		m = o
	}
	if m == nil {
		t.Fatalf("no emulated module %s: %v", l.file, emuBuildErrs[l.file])
	}
	if l.args.over {
		return fmt.Errorf("%s: too many parameters", l.entry)
	}
	vals := make([]uint64, l.args.n)
	copy(vals, l.args.vals[:l.args.n])
	params := make([]unsafe.Pointer, len(vals))
	for i := range vals {
		params[i] = unsafe.Pointer(&vals[i])
	}
	emuLaunched.Store(l.file+":"+l.entry, true)
	start := time.Now()
	err := m.Launch(l.entry, [3]uint32{l.grid.X, l.grid.Y, l.grid.Z}, [3]uint32{l.block.X, l.block.Y, l.block.Z},
		uint32(l.shared), params, sched, seed)
	emuTimeMu.Lock()
	emuTime += time.Since(start)
	emuTimeMu.Unlock()
	return err
}

// emuSeeds is how many seeds the random and warp-ahead schedules each run with:
// $RESIN_EMU_SEEDS, default 1 (more explores more interleavings).
var emuSeeds = sync.OnceValue(func() int {
	n, err := strconv.Atoi(os.Getenv("RESIN_EMU_SEEDS"))
	if err != nil || n < 1 {
		return 1
	}
	return n
})

// emuRun runs launches, in order, under every schedule from the memory's present state,
// checks that every buffer ends bit-identical under each, and leaves the memory as the
// forward schedule left it.
func emuRun(t testing.TB, name string, m *emuMem, launches ...emuLaunch) {
	t.Helper()
	before := m.snapshot()
	var first [][]byte
	type run struct {
		sched emu.Schedule
		seed  uint64
	}
	runs := []run{{emu.Reverse, 0}}
	for k := range emuSeeds() {
		seed := uint64(len(name))*7919 + uint64(k)*104729
		runs = append(runs, run{emu.Random, seed}, run{emu.WarpAhead, seed})
	}
	runs = append(runs, run{emu.Forward, 0})
	for _, r := range runs {
		sched := r.sched
		m.restore(before)
		for i := range launches {
			if err := launches[i].run(t, sched, r.seed); err != nil {
				t.Fatalf("%s (%v, seed %d): %v", name, sched, r.seed, err)
			}
		}
		m.checkGuards(fmt.Sprintf("%s (%v)", name, sched))
		after := m.snapshot()
		if first == nil {
			first = after
			continue
		}
		for i := range after {
			if !bytes.Equal(after[i], first[i]) {
				at := 0
				for at < len(after[i]) && after[i][at] == first[i][at] {
					at++
				}
				t.Fatalf("%s: buffer %d differs at byte %d between the %v and %v (seed %d) schedules", name, i, at, runs[0].sched, sched, r.seed)
			}
		}
	}
}

func emuRnd(seed uint64, n int, scale float32) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	s := make([]float32, n)
	for i := range s {
		s[i] = (r.Float32()*2 - 1) * scale
	}
	return s
}

func emuRndBF16(seed uint64, n int, scale float32) ([]float32, []uint16) {
	x := emuRnd(seed, n, scale)
	return x, emuRoundBF16(x)
}

// emuRoundBF16 rounds x to bf16 in place and returns the bits.
func emuRoundBF16(x []float32) []uint16 {
	h := make([]uint16, len(x))
	for i, v := range x {
		h[i] = weights.Float32ToBF16(v)
		x[i] = weights.BF16ToFloat32(h[i])
	}
	return h
}

// emuClose fails when got and want differ by more than tol·(1+|want|) (NaN must meet
// NaN, an infinity the same infinity), reporting the worst element.
func emuClose(t testing.TB, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(w) || math.IsInf(w, 0) || math.IsNaN(g) || math.IsInf(g, 0) {
			if !(math.IsNaN(w) && math.IsNaN(g)) && g != w {
				t.Fatalf("%s: element %d = %g, want %g", name, i, g, w)
			}
			continue
		}
		if d := math.Abs(g-w) / (1 + math.Abs(w)); d > worst {
			worst, at = d, i
		}
	}
	if worst > tol {
		t.Fatalf("%s: element %d = %g, want %g (relative error %.3g > %.3g)", name, at, got[at], want[at], worst, tol)
	}
}

// emuUlps is the distance in float32 ulps between a and b (0 for equal values, ±0 equal).
func emuUlps(a, b float32) uint32 {
	key := func(f float32) int64 {
		u := int64(math.Float32bits(f))
		if u&0x80000000 != 0 {
			return -(u & 0x7fffffff)
		}
		return u
	}
	d := key(a) - key(b)
	if d < 0 {
		d = -d
	}
	return uint32(min(d, math.MaxUint32))
}

// emuMaxUlps fails when any element of got is more than ulps from want.
func emuMaxUlps(t testing.TB, name string, got, want []float32, ulps uint32) {
	t.Helper()
	worst, at := uint32(0), -1
	for i := range want {
		if math.IsNaN(float64(want[i])) && math.IsNaN(float64(got[i])) {
			continue
		}
		if d := emuUlps(got[i], want[i]); d > worst {
			worst, at = d, i
		}
	}
	if worst > ulps {
		t.Fatalf("%s: element %d = %g, want %g (%d ulps > %d)", name, at, got[at], want[at], worst, ulps)
	}
}

// emuEntries lists every kernel entry point of the sources, for the coverage check.
func emuEntries(testing.TB) []string {
	var all []string
	for _, name := range Names() {
		src, err := Source(name)
		if err != nil {
			panic(err) // embedded sources: cannot fail
		}
		for _, k := range emu.Kernels(src) {
			all = append(all, name+":"+k)
		}
	}
	sort.Strings(all)
	return all
}
