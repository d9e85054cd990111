package weights

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestProgressPrinter(t *testing.T) {
	var out strings.Builder
	t0 := time.Unix(0, 0)
	var now time.Time
	p := &progressPrinter{w: &out, every: 200 * time.Millisecond, now: func() time.Time { return now }}
	steps := []struct {
		at   time.Duration
		r    Progress
		want string // what this report writes
	}{
		{0, Progress{1, 4, 512, 4 << 30, false}, "\rweights: 1/4 tensors, 512 B/4.0 GiB"},
		{100 * time.Millisecond, Progress{2, 4, 1536, 4 << 30, false}, ""}, // throttled
		{250 * time.Millisecond, Progress{3, 4, 3 << 29, 4 << 30, false}, "\rweights: 3/4 tensors, 1.5 GiB/4.0 GiB"},
		{300 * time.Millisecond, Progress{4, 4, 4 << 30, 4 << 30, false}, "\rweights: 4/4 tensors, 4.0 GiB/4.0 GiB in 0.3s\n"}, // all read: final, unthrottled
		{900 * time.Millisecond, Progress{4, 4, 4 << 30, 4 << 30, true}, ""},                                                   // Close after the final line
	}
	for _, s := range steps {
		now = t0.Add(s.at)
		before := out.Len()
		p.report(s.r)
		if got := out.String()[before:]; got != s.want {
			t.Errorf("at %v: wrote %q, want %q", s.at, got, s.want)
		}
	}

	// A load that skips tensors ends with Close's report.
	out.Reset()
	p = &progressPrinter{w: &out, every: time.Hour, now: func() time.Time { return now }}
	now = t0
	p.report(Progress{1, 3, 2048, 3 << 20, false})
	p.report(Progress{2, 3, 1 << 20, 3 << 20, false})
	now = t0.Add(1500 * time.Millisecond)
	p.report(Progress{2, 3, 1 << 20, 3 << 20, true})
	if want := "\rweights: 1/3 tensors, 2.0 KiB/3.0 MiB\rweights: 2/3 tensors, 1.0 MiB/3.0 MiB in 1.5s\n"; out.String() != want {
		t.Errorf("wrote %q, want %q", out.String(), want)
	}
}

func TestCheckpointProgress(t *testing.T) {
	dir := t.TempDir()
	ts := []Tensor{
		mustTensor(t, "a", F32, []int{2}, []float32{1, 2}),
		mustTensor(t, "b", BF16, []int{3}, []float32{1, 2, 3}),
		mustTensor(t, "c", F32, []int{1}, []float32{1}),
		{Name: "q.weight", DType: F8E4M3, Shape: []int{1, 2}, Data: []byte{0x38, 0x38}},
		{Name: "q.scale", DType: F8E8M0, Shape: []int{1, 1}, Data: []byte{127}},
	}
	if err := WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []Progress
	ck.SetProgress(func(p Progress) { got = append(got, p) })
	ck.Float32("a", 2)
	ck.Float32("a", 2) // read again: not counted, not reported
	ck.Float32("b", 9) // wrong shape: not counted
	ck.Float32("b", 3)
	q := &Quant{Method: "fp8", BlockSize: [2]int{128, 128}, ScaleFormat: ScaleUE8M0, ExpertDType: ExpertFP8}
	if _, err := ck.Dequantize("q.weight", q, 1, 2); err != nil {
		t.Fatal(err)
	}
	ck.Close()
	want := []Progress{
		{1, 5, 8, 21, false},
		{2, 5, 14, 21, false},
		{4, 5, 17, 21, false}, // the weight and its scale (8+6+2+1 of 21 bytes)
		{4, 5, 17, 21, true},  // Close; "c" was never read
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("reports\n got %v\nwant %v", got, want)
	}
}

// TestTerminalProgress checks that a load is silent when stderr is not a terminal.
func TestTerminalProgress(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stderr
	os.Stderr = f
	defer func() { os.Stderr = saved }()
	if TerminalProgress() != nil {
		t.Error("progress reported to a regular file")
	}
}
