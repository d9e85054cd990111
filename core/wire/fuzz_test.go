package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// fixturePayload returns the payload of testdata/name.bin.
func fixturePayload(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name+".bin"))
	if err != nil {
		t.Fatal(err)
	}
	return b[frameHeader:]
}

// fuzzRoundTrip fuzzes a decoder from the fixture of message name: whatever decodes must
// encode back to the same bytes.
func fuzzRoundTrip[M any](f *testing.F, name string, decode func([]byte) (M, error), encode func(M) []byte) {
	f.Add(fixturePayload(f, name))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decode(p)
		if err != nil {
			return
		}
		if again := encode(m)[frameHeader:]; !bytes.Equal(again, p) {
			t.Fatalf("%s %x decodes to %+v, which encodes to %x", name, p, m, again)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	fuzzRoundTrip(f, "hello", DecodeHello, func(h Hello) []byte { return AppendHello(nil, h) })
}

func FuzzDecodeInfo(f *testing.F) {
	fuzzRoundTrip(f, "info", DecodeInfo, func(m Info) []byte { return AppendInfo(nil, m) })
}

func FuzzDecodeResult(f *testing.F) {
	f.Add(fixturePayload(f, "result"))
	f.Fuzz(func(t *testing.T, p []byte) {
		var res engine.StepResult
		step, err := DecodeResult(p, &res)
		if err != nil {
			return
		}
		if again := AppendResult(nil, step, &res)[frameHeader:]; !bytes.Equal(again, p) {
			t.Fatalf("result %x re-encodes to %x", p, again)
		}
	})
}

func FuzzDecodeError(f *testing.F) {
	fuzzRoundTrip(f, "error", DecodeError, func(m Error) []byte { return AppendError(nil, m) })
}

func FuzzDecodeShutdown(f *testing.F) {
	f.Add(fixturePayload(f, "shutdown"))
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, p []byte) {
		if err := DecodeShutdown(p); (err == nil) != (len(p) == 0) {
			t.Fatalf("shutdown of %d bytes: %v", len(p), err)
		}
	})
}

// FuzzDecodeStep decodes arbitrary steps on top of the tables of a first, valid step: a
// decoded plan must be valid and every row's page tables must be the tables held.
func FuzzDecodeStep(f *testing.F) {
	first := fixturePayload(f, "step1")
	f.Add(fixturePayload(f, "step2"))
	f.Add(first)
	f.Fuzz(func(t *testing.T, p []byte) {
		var tables Tables
		var plan engine.BatchPlan
		if err := tables.DecodeStep(first, &plan); err != nil {
			t.Fatal(err)
		}
		if err := tables.DecodeStep(p, &plan); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if err := plan.Validate(); err != nil {
			t.Fatalf("a decoded plan is invalid: %v", err)
		}
		for g := range plan.Groups {
			for i, id := range plan.ReqIDs {
				if got, held := plan.PageTableOf(g, i), tables.Table(id, g); !slicesEqual(got, held) {
					t.Fatalf("row %d group %d: plan table %v, held %v", i, g, got, held)
				}
			}
		}
	})
}

// FuzzReadFrame reads frames from arbitrary bytes with a small limit: no panic, no
// frame over the limit, and a clean io.EOF only between frames.
func FuzzReadFrame(f *testing.F) {
	for _, name := range []string{"hello", "info", "step1", "step2", "result", "error", "shutdown"} {
		b, err := os.ReadFile(filepath.Join("testdata", name+".bin"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr := NewFrameReader(bytes.NewReader(b), 1024)
		for {
			_, p, err := fr.Read()
			if err != nil {
				return
			}
			if len(p)+1 > 1024 {
				t.Fatalf("a frame of %d bytes passed the 1024-byte limit", len(p)+1)
			}
		}
	})
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMalformed lists inputs every decoder must refuse with a clear error.
func TestMalformed(t *testing.T) {
	hello := fixturePayload(t, "hello")
	v2 := append([]byte(nil), hello...)
	binary.LittleEndian.PutUint16(v2[4:], 2)
	info := fixturePayload(t, "info")
	infoV0 := append([]byte(nil), info...)
	binary.LittleEndian.PutUint16(infoV0, 0)
	step := fixturePayload(t, "step1")
	huge := append([]byte(nil), step...)
	binary.LittleEndian.PutUint32(huge[12:], 1<<30) // B
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"hello of another version", func() error { _, err := DecodeHello(v2); return err }(), "version 2"},
		{"hello with a bad magic", func() error { _, err := DecodeHello(append([]byte("XXXX"), hello[4:]...)); return err }(), "magic"},
		{"info of another version", func() error { _, err := DecodeInfo(infoV0); return err }(), "version 0"},
		{"info cut short", func() error { _, err := DecodeInfo(info[:len(info)-3]); return err }(), "need"},
		{"info with trailing bytes", func() error { _, err := DecodeInfo(append(append([]byte(nil), info...), 0)); return err }(), "trailing"},
		{"step with forged counts", func() error { var tb Tables; return tb.DecodeStep(huge, &engine.BatchPlan{}) }(), "do not fit"},
		{"step cut in half", func() error { var tb Tables; return tb.DecodeStep(step[:len(step)/2], &engine.BatchPlan{}) }(), "do not fit"},
		{"result whose counts disagree", func() error {
			p := append([]byte(nil), fixturePayload(t, "result")...)
			binary.LittleEndian.PutUint32(p[8:], 99)
			_, err := DecodeResult(p, &engine.StepResult{})
			return err
		}(), "counts"},
		{"shutdown with a payload", DecodeShutdown([]byte{1}), "payload"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, c.err, c.want)
		}
	}
	frames := []struct {
		name string
		b    []byte
		want string
	}{
		{"length 0", []byte{0, 0, 0, 0}, "length 0"},
		{"over the limit", []byte{0, 0, 0, 0x40, 3}, "limit is 1024"},
		{"cut inside a frame", []byte{10, 0, 0, 0, 3, 1, 2}, "unexpected EOF"},
	}
	for _, c := range frames {
		_, _, err := NewFrameReader(bytes.NewReader(c.b), 1024).Read()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("frame %s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
	if _, _, err := NewFrameReader(bytes.NewReader(nil), 0).Read(); err != io.EOF {
		t.Errorf("an empty stream: %v, want io.EOF", err)
	}
}

// TestDeltaBytes: a decoding sequence costs no table bytes until it crosses a block, and
// then one page; whole tables cost every page every step.
func TestDeltaBytes(t *testing.T) {
	plan := func(step uint64, computed int32, table []uint32) *engine.BatchPlan {
		p := &engine.BatchPlan{Step: step, ReqIDs: []uint64{1}, Computed: []int32{computed}, Scheduled: []int32{1}, PromptLen: []int32{1},
			NumDrafts: []int32{0}, Temperature: []float32{0}, TopP: []float32{1}, TopK: []int32{0}, MinP: []float32{0}, Seed: []uint64{0},
			Logprobs: []int32{-1}, QueryStart: []int32{0, 1}, LogitsStart: []int32{0, 1}, Tokens: []int32{5}, Positions: []int32{computed},
			LogitsIndices: []int32{0}, Groups: []engine.GroupPlan{{SlotMapping: []int64{0}, PageTableStart: []int32{0, int32(len(table))}}}}
		for _, pg := range table {
			p.Groups[0].PageTable = append(p.Groups[0].PageTable, kvPage(pg))
		}
		return p
	}
	var delta, whole Encoder
	whole.WholeTables = true
	table := []uint32{10, 11, 12}
	size := func(x *Encoder, p *engine.BatchPlan) int {
		b, err := x.AppendStep(nil, p)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	d1, w1 := size(&delta, plan(1, 40, table)), size(&whole, plan(1, 40, table))
	d2, w2 := size(&delta, plan(2, 41, table)), size(&whole, plan(2, 41, table))
	table = append(table, 13)
	d3, w3 := size(&delta, plan(3, 48, table)), size(&whole, plan(3, 48, table))
	if d1 != w1 || w2 != w1 || d2 != d1-16-8-12 || d3 != d2+16+8+4 || w3 != w2+4 {
		t.Fatalf("step sizes: deltas %d %d %d, whole tables %d %d %d", d1, d2, d3, w1, w2, w3)
	}
}

func kvPage(p uint32) kvslab.PageID { return kvslab.PageID(p) }
