package cli

import (
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestDTypeFlag: --dtype reaches the model's dtype opener parsed (int8, bf16, fp8; fp32
// by default), the startup note names the dtype and its kernel, and a dtype that is not one,
// or one for the GPU runner, is refused before anything opens.
func TestDTypeFlag(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string // the dtype opened; "": refused
		err   string
	}{
		{want: "fp32"},
		{flags: []string{"--dtype", "int8"}, want: "int8"},
		{flags: []string{"--dtype", "BF16"}, want: "bf16"},
		{flags: []string{"--dtype", "fp8"}, want: "fp8"},
		{flags: []string{"--dtype", "fp4"}, err: `--dtype: dtype "fp4": want fp32, bf16, int8 or fp8`},
		{flags: []string{"--dtype", "int8", "--device", "cuda"}, err: "only the CPU runner"},
	} {
		var got string
		open := func(d string, b int64, dt string) (engine.Runner, *kvslab.Pool, error) {
			got = dt
			return testOpener(d, b)
		}
		args := append([]string{"--model", modelDir(t, false), "--max-tokens", "2", "--prompt-ids", "1"}, c.flags...)
		_, errOut, err := run(t, GenerateCmd(NewModelDir("test", testOpener).WithDType(open)), args...)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || got != "" {
				t.Errorf("%v: error %v, opened %q; want a refusal saying %q", c.flags, err, got, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: error %v, opened as %q; want %q", c.flags, err, got, c.want)
		}
		if note := "note: CPU weights " + c.want + ": "; !strings.Contains(errOut, note) {
			t.Errorf("%v: no startup note %q in %q", c.flags, note, errOut)
		}
	}
	// A model without a dtype opener takes no --dtype.
	_, _, err := run(t, GenerateCmd(NewModelDir("test", testOpener)), "--model", modelDir(t, false), "--dtype", "int8", "--prompt-ids", "1")
	if err == nil || !strings.Contains(err.Error(), "unknown flag: --dtype") {
		t.Errorf("a model without OpenDType: %v", err)
	}
}
