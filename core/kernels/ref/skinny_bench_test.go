package ref

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkGemvCached runs the one-row kernels on a weight that stays in L2 (64 rows of
// k=1024: 256 KiB in float32, 128 KiB in bfloat16, 72 KiB in int8 blocks), on the caller's
// goroutine: what a kernel computes a second when memory is not the bound, the figure a
// change to its instructions moves (BenchmarkDecodeWeights, from memory, follows the
// machine's bandwidth and its load as much). Weight bytes per second of the process's CPU
// time:
//
//	go test ./core/kernels/ref -run '^$' -bench GemvCached -cpu 1
func BenchmarkGemvCached(b *testing.B) {
	if !skinnyVector(1024) {
		b.Skip("no vector kernels on this CPU")
	}
	const k, n = 1024, 64
	r := rand.New(rand.NewPCG(5, 6))
	x, w, out := randSlice(r, k), randSlice(r, n*k), make([]float32, n)
	wb := make([]uint16, n*k)
	for i, v := range w {
		wb[i] = BF16(v)
	}
	xp := make([]float32, k)
	evenOdd(xp, x)
	q, err := QuantizeInt8(w, n, k)
	if err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, bytes int64, f func()) {
		cpu0 := processCPU()
		for b.Loop() {
			f()
		}
		total := float64(bytes) * float64(b.N)
		if cpu := processCPU() - cpu0; cpu > 0 {
			b.ReportMetric(total/cpu.Seconds()/1e9, "GB/cpu-s")
			b.ReportMetric(2*float64(n*k)*float64(b.N)/cpu.Seconds()/1e9, "GFLOP/cpu-s")
		}
	}
	b.Run("fp32", func(b *testing.B) { run(b, 4*n*k, func() { gemv(out, x, k, w, k, n) }) })
	b.Run("bf16", func(b *testing.B) { run(b, 2*n*k, func() { gemvBF16(out, x, nil, k, wb, k, n) }) })
	if gemvBF16EvenOdd(k) {
		b.Run("bf16-evenodd", func(b *testing.B) { run(b, 2*n*k, func() { gemvBF16(out, x, xp, k, wb, k, n) }) })
	}
	b.Run("int8", func(b *testing.B) {
		if err := MatMulTInt8(out, x, q, 1); err != nil { // the activations' buffers, once
			b.Fatal(err)
		}
		t := int8Tasks.get()
		defer int8Tasks.put(t)
		t.out, t.w, t.m = out, q, 1
		t.quantize(x)
		run(b, q.Bytes(), func() { t.run(0, 0, n/q8Group) })
	})
}
