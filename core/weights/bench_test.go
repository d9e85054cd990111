package weights

import "testing"

// BenchmarkDecodeBF16 measures widening 1M bfloat16 values to float32 (a 2 MB tensor).
func BenchmarkDecodeBF16(b *testing.B) {
	src := make([]float32, 1<<20)
	for i := range src {
		src[i] = float32(i%1000) * 0.001
	}
	raw, _ := EncodeFloat32(src, BF16)
	dst := make([]float32, len(src))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := DecodeFloat32(dst, raw, BF16); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeF16 measures widening 1M half-precision values to float32.
func BenchmarkDecodeF16(b *testing.B) {
	src := make([]float32, 1<<20)
	for i := range src {
		src[i] = float32(i%1000) * 0.001
	}
	raw, _ := EncodeFloat32(src, F16)
	dst := make([]float32, len(src))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := DecodeFloat32(dst, raw, F16); err != nil {
			b.Fatal(err)
		}
	}
}
