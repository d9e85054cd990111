package ref

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestRoPEKnownRotation(t *testing.T) {
	// dim 4, theta 100: inverse frequencies 1 and 0.1.
	tab, err := NewRopeTable(4, 8, 100)
	if err != nil {
		t.Fatal(err)
	}
	c0, s0 := float32(math.Cos(3)), float32(math.Sin(3))
	c1, s1 := float32(math.Cos(0.3)), float32(math.Sin(0.3))

	x := []float32{1, 2, 3, 4, 9} // one head of dim 5: 4 rotated, 1 passed through
	if err := tab.RoPENeoX(x, []int32{3}, 1, 1, 5); err != nil {
		t.Fatal(err)
	}
	// pairs (0,2) at freq 1, (1,3) at freq 0.1
	near(t, "NeoX", x, []float32{1*c0 - 3*s0, 2*c1 - 4*s1, 3*c0 + 1*s0, 4*c1 + 2*s1, 9}, 1e-6)

	y := []float32{1, 2, 3, 4, 9}
	if err := tab.RoPEInterleaved(y, []int32{3}, 1, 1, 5); err != nil {
		t.Fatal(err)
	}
	// pairs (0,1) at freq 1, (2,3) at freq 0.1
	near(t, "Interleaved", y, []float32{1*c0 - 2*s0, 2*c0 + 1*s0, 3*c1 - 4*s1, 4*c1 + 3*s1, 9}, 1e-6)
}

func TestRoPERelativePosition(t *testing.T) {
	// q·k after rotation depends only on the distance between the positions.
	tab, _ := NewRopeTable(8, 64, 10000)
	r := rand.New(rand.NewPCG(3, 4))
	q, k := randSlice(r, 8), randSlice(r, 8)
	score := func(pq, pk int32, rot func([]float32, []int32, int, int, int) error) float64 {
		qq, kk := append([]float32(nil), q...), append([]float32(nil), k...)
		if err := rot(qq, []int32{pq}, 1, 1, 8); err != nil {
			t.Fatal(err)
		}
		if err := rot(kk, []int32{pk}, 1, 1, 8); err != nil {
			t.Fatal(err)
		}
		return dot(qq, kk)
	}
	for name, rot := range map[string]func([]float32, []int32, int, int, int) error{
		"neox": tab.RoPENeoX, "interleaved": tab.RoPEInterleaved,
	} {
		a, b := score(10, 7, rot), score(40, 37, rot)
		if math.Abs(a-b) > 1e-4 {
			t.Errorf("%s: q·k at (10,7) = %g but at (40,37) = %g", name, a, b)
		}
		if c := score(10, 0, rot); math.Abs(a-c) < 1e-4 {
			t.Errorf("%s: q·k did not change with the distance", name)
		}
	}
}

func TestRoPEErrors(t *testing.T) {
	tab, _ := NewRopeTable(4, 8, 10000)
	if err := tab.RoPENeoX(make([]float32, 4), []int32{8}, 1, 1, 4); err == nil {
		t.Error("position past the table: no error")
	}
	if err := tab.RoPENeoX(make([]float32, 2), []int32{0}, 1, 1, 2); err == nil {
		t.Error("rotary dim above head dim: no error")
	}
	if _, err := NewRopeTable(3, 8, 10000); err == nil {
		t.Error("odd rotary dim: no error")
	}
	var nilTab *RopeTable
	if err := nilTab.RoPEInterleaved(make([]float32, 4), []int32{0}, 1, 1, 4); err == nil {
		t.Error("nil table: no error")
	}
}
