package emu

import "testing"

func BenchmarkShuffle(b *testing.B) {
	m := load(b, `extern "C" __global__ void shfl(float* out, int n) {
  float v = threadIdx.x;
  for (int i = 0; i < n; i++) v += __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}`, "bench_shfl.cu")
	out := mem[float32](128)
	for _, sched := range Schedules {
		b.Run(sched.String(), func(b *testing.B) {
			for b.Loop() {
				if err := m.Launch("shfl", [3]uint32{1, 1, 1}, [3]uint32{128, 1, 1}, 0, params([]uint64{ptr(out), 1000}), sched, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/4000, "ns/warp-op")
		})
	}
}
