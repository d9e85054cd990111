package ref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestAMXBF16Gemm: the AMX prefill product equals the product of x rounded to bfloat16 and
// the bfloat16 w (float64 reference), within bf16DotTol of each output's Σ|terms|, on
// shapes with partial groups of tokens (rows not a multiple of 32, one row), partial
// blocks of w's rows (columns not a multiple of 32, fewer than 16) and long rows; NaN and
// infinite inputs come out as the reference's; a k that is not a multiple of 32 is
// refused (false) for the caller's fallback.
func TestAMXBF16Gemm(t *testing.T) {
	if !hasAMXBF16 {
		t.Skipf("no AMX-BF16 granted here: %s", AMX().Reason)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, sh := range [][3]int{{1, 32, 1}, {9, 64, 7}, {32, 32, 32}, {33, 1024, 100}, {100, 256, 33}, {512, 128, 64}, {17, 2048, 48}} {
		m, k, n := sh[0], sh[1], sh[2]
		x, w := make([]float32, m*k), make([]uint16, n*k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		for i := range w {
			w[i] = BF16(float32(rng.NormFloat64()) / 8)
		}
		out := nanFilled(m * n)
		if !amxBF16Gemm(out, x, w, m, k, n) {
			t.Fatalf("%v: refused", sh)
		}
		worst := 0.0
		for i := range m {
			for j := range n {
				var ref, mag float64
				for l := range k {
					term := float64(FromBF16(BF16(x[i*k+l]))) * float64(FromBF16(w[j*k+l]))
					ref += term
					mag += math.Abs(term)
				}
				d := math.Abs(float64(out[i*n+j])-ref) / max(mag, 1e-30)
				if !(d <= bf16DotTol) {
					t.Fatalf("%v: out[%d,%d] = %g, reference %g (%.3g of Σ|terms|)", sh, i, j, out[i*n+j], ref, d)
				}
				worst = max(worst, d)
			}
		}
		t.Logf("%v: within %.3g of Σ|terms|", sh, worst)
	}
	// Specials: a NaN in x makes its row's outputs NaN; an infinity, ±Inf.
	m, k, n := 3, 32, 2
	x, w := make([]float32, m*k), make([]uint16, n*k)
	for i := range w {
		w[i] = BF16(1)
	}
	x[5] = float32(math.NaN())
	x[k+7] = float32(math.Inf(1))
	out := nanFilled(m * n)
	if !amxBF16Gemm(out, x, w, m, k, n) {
		t.Fatal("refused")
	}
	if !math.IsNaN(float64(out[0])) || !math.IsInf(float64(out[n]), 1) || out[2*n] != 0 {
		t.Errorf("NaN, +Inf and 0 rows give %v", out)
	}
	if amxBF16Gemm(make([]float32, 9), make([]float32, 9*48), make([]uint16, 48), 9, 48, 1) {
		t.Error("k = 48 was not refused")
	}
}

// TestAMXEncoding re-derives each hand-written AMX instruction's VEX bytes in
// amxbf16_amd64.s and amxint8_amd64.s from the Intel-order mnemonic in its comment: Go's
// assembler has none.
func TestAMXEncoding(t *testing.T) {
	var src []byte
	for _, f := range []string{"amxbf16_amd64.s", "amxint8_amd64.s"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	line := regexp.MustCompile(`^\s*((?:BYTE \$0x[0-9a-f]{2};?\s*)+)// (\S+)\s*(.*)$`)
	seen := 0
	for i, l := range strings.Split(string(src), "\n") {
		g := line.FindStringSubmatch(l)
		if g == nil {
			continue
		}
		var got []byte
		for _, b := range regexp.MustCompile(`0x[0-9a-f]{2}`).FindAllString(g[1], -1) {
			v, _ := strconv.ParseUint(b[2:], 16, 8)
			got = append(got, byte(v))
		}
		want, err := amxEncode(g[2], g[3])
		if err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if fmt.Sprintf("% x", got) != fmt.Sprintf("% x", want) {
			t.Errorf("line %d: %s %s is % x, the encoding is % x", i+1, g[2], g[3], got, want)
		}
		seen++
	}
	if seen < 40 {
		t.Fatalf("only %d encoded instructions found", seen)
	}
}

// amxEncode encodes the forms amxbf16_amd64.s uses: the VEX prefix C4, map 0F38, W0, L0.
func amxEncode(op, args string) ([]byte, error) {
	gpr := map[string]byte{"rax": 0, "rcx": 1, "rdx": 2, "rbx": 3, "rsp": 4, "rbp": 5, "rsi": 6, "rdi": 7,
		"r8": 8, "r9": 9, "r10": 10, "r11": 11, "r12": 12, "r13": 13, "r14": 14, "r15": 15}
	tmm := func(s string) (byte, error) {
		if !strings.HasPrefix(s, "tmm") || len(s) != 4 || s[3] < '0' || s[3] > '7' {
			return 0, fmt.Errorf("%q is not a tile register", s)
		}
		return s[3] - '0', nil
	}
	vex := func(r, x, b, vvvv, pp, opc byte) []byte {
		return []byte{0xc4, (^r&1)<<7 | (^x&1)<<6 | (^b&1)<<5 | 0b00010, (^vvvv&0xf)<<3 | pp, opc}
	}
	// mem parses [base+index*1] or [base+index*1+disp] into ModRM (with reg), SIB and disp.
	mem := func(s string, reg byte) (x, b byte, tail []byte, err error) {
		m := regexp.MustCompile(`^\[(\w+)(?:\+(\w+)\*1)?(?:\+(\d+))?\]$`).FindStringSubmatch(s)
		if m == nil {
			return 0, 0, nil, fmt.Errorf("memory operand %q", s)
		}
		base, ok := gpr[m[1]]
		if !ok || base&7 == 5 {
			return 0, 0, nil, fmt.Errorf("base %q", m[1])
		}
		disp := 0
		if m[3] != "" {
			disp, _ = strconv.Atoi(m[3])
		}
		mod := byte(0) // no displacement, else 8 bits where it fits, else 32
		switch {
		case disp >= -128 && disp < 128 && disp != 0:
			mod = 1
		case disp != 0:
			mod = 2
		}
		if m[2] == "" { // [base]: no SIB (base is not rsp/r12 here)
			if base&7 == 4 {
				return 0, 0, nil, fmt.Errorf("base %q needs a SIB", m[1])
			}
			tail = []byte{mod<<6 | (reg&7)<<3 | base&7}
		} else {
			idx, ok := gpr[m[2]]
			if !ok || idx == 4 {
				return 0, 0, nil, fmt.Errorf("index %q", m[2])
			}
			tail = []byte{mod<<6 | (reg&7)<<3 | 4, (idx&7)<<3 | base&7}
			x = idx >> 3
		}
		switch mod {
		case 1:
			tail = append(tail, byte(disp))
		case 2:
			tail = append(tail, byte(disp), byte(disp>>8), byte(disp>>16), byte(disp>>24))
		}
		return x, base >> 3, tail, nil
	}
	a := strings.Split(strings.ReplaceAll(args, " ", ""), ",")
	const np, p66, pf3, pf2 = 0, 1, 2, 3
	switch op {
	case "TILERELEASE":
		return append(vex(0, 0, 0, 0, np, 0x49), 0xc0), nil
	case "TILEZERO":
		r, err := tmm(a[0])
		if err != nil {
			return nil, err
		}
		return append(vex(0, 0, 0, 0, pf2, 0x49), 0xc0|r<<3), nil
	case "LDTILECFG":
		x, b, tail, err := mem(a[0], 0)
		if err != nil {
			return nil, err
		}
		return append(vex(0, x, b, 0, np, 0x49), tail...), nil
	case "TILELOADD", "TILESTORED":
		ri, mi, pp := 0, 1, byte(pf2)
		if op == "TILESTORED" {
			ri, mi, pp = 1, 0, pf3
		}
		r, err := tmm(a[ri])
		if err != nil {
			return nil, err
		}
		x, b, tail, err := mem(a[mi], r)
		if err != nil {
			return nil, err
		}
		return append(vex(0, x, b, 0, pp, 0x4b), tail...), nil
	case "TDPBF16PS", "TDPBSUD":
		opc := byte(0x5c)
		if op == "TDPBSUD" {
			opc = 0x5e
		}
		d, err1 := tmm(a[0])
		s1, err2 := tmm(a[1])
		s2, err3 := tmm(a[2])
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("operands %q", args)
		}
		return append(vex(0, 0, 0, s2, pf3, opc), 0xc0|d<<3|s1), nil
	}
	_ = p66
	return nil, fmt.Errorf("no encoding for %s", op)
}

// TestWeightAsStored: NewWeightAsStored's bf16 weight computes in float32 on the widened
// weights whatever the CPU has (the float32 paths' bits, x not rounded), its bytes the
// rows' own; other dtypes are NewWeight's.
func TestWeightAsStored(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	const m, k, n = 9, 64, 40
	wf, x := randSlice(rng, n*k), randSlice(rng, m*k)
	rows := make([]uint16, n*k)
	for i, v := range wf {
		rows[i] = BF16(v)
	}
	w, err := NewWeightAsStored(wf, n, k, DTypeBF16)
	if err != nil {
		t.Fatal(err)
	}
	if !w.fp32Only || w.Bytes() != 2*n*k {
		t.Fatalf("fp32Only %v, %d bytes", w.fp32Only, w.Bytes())
	}
	got, want := nanFilled(m*n), nanFilled(m*n)
	if err := w.MatMulT(got, x, m); err != nil {
		t.Fatal(err)
	}
	if err := matMulTBF16F32(want, x, rows, m, k, n); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("out[%d] = %v, the float32 paths give %v", i, got[i], want[i])
		}
	}
	if i8, err := NewWeightAsStored(wf, n, k, DTypeInt8); err != nil || i8.q8 == nil {
		t.Fatalf("int8: %v", err)
	}
	if _, err := NewWeightAsStored(wf[:5], n, k, DTypeBF16); err == nil {
		t.Error("a short w was not refused")
	}
}

// TestAMXInt8: MatMulTInt8 on AMX tiles (a prefill: more than skinnyRows rows) gives, to
// the bit, what the VNNI kernels give each row alone (a decode step) and the batch with
// AMX off, on shapes with a partial group of tokens (rows not a multiple of 16), a partial
// group of w's rows (n not a multiple of 16), k not a multiple of 32 (the last block
// padded) and a row with a NaN (its outputs NaN).
func TestAMXInt8(t *testing.T) {
	if !hasAMXInt8 {
		t.Skipf("no AMX-INT8 granted here: %s", AMX().Reason)
	}
	rng := rand.New(rand.NewPCG(6, 7))
	for _, sh := range [][3]int{{9, 32, 16}, {17, 64, 20}, {40, 1024, 48}, {33, 100, 7}, {128, 256, 64}} {
		m, k, n := sh[0], sh[1], sh[2]
		wf, x := randSlice(rng, n*k), randSlice(rng, m*k)
		if m > 17 {
			x[17*k+3] = float32(math.NaN())
		}
		w, err := QuantizeInt8(wf, n, k)
		if err != nil {
			t.Fatal(err)
		}
		got := nanFilled(m * n)
		if err := MatMulTInt8(got, x, w, m); err != nil {
			t.Fatal(err)
		}
		old := hasAMXInt8
		hasAMXInt8 = false
		off := nanFilled(m * n)
		err = MatMulTInt8(off, x, w, m)
		hasAMXInt8 = old
		if err != nil {
			t.Fatal(err)
		}
		for i := range m {
			row := nanFilled(n)
			if err := MatMulTInt8(row, x[i*k:(i+1)*k], w, 1); err != nil {
				t.Fatal(err)
			}
			for j := range n {
				g := math.Float32bits(got[i*n+j])
				if g != math.Float32bits(row[j]) || g != math.Float32bits(off[i*n+j]) {
					t.Fatalf("%v: out[%d,%d] = %v on AMX, %v alone, %v with AMX off", sh, i, j, got[i*n+j], row[j], off[i*n+j])
				}
			}
		}
		if m > 17 && !math.IsNaN(float64(got[17*n])) {
			t.Fatalf("%v: the NaN row gives %v", sh, got[17*n])
		}
	}
}
