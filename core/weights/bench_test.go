package weights

import "testing"

// BenchmarkDecodeBF16 measures widening 1M bfloat16 values to float32 (a 2 MB tensor).
func BenchmarkDecodeBF16(b *testing.B) { benchDecode(b, BF16) }

// BenchmarkDecodeF16 measures widening 1M half-precision values to float32.
func BenchmarkDecodeF16(b *testing.B) { benchDecode(b, F16) }

// benchDecode measures DecodeFloat32 widening 1M values of dt.
func benchDecode(b *testing.B, dt DType) {
	src := make([]float32, 1<<20)
	for i := range src {
		src[i] = float32(i%1000) * 0.001
	}
	raw, _ := EncodeFloat32(src, dt)
	dst := make([]float32, len(src))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := DecodeFloat32(dst, raw, dt); err != nil {
			b.Fatal(err)
		}
	}
}
