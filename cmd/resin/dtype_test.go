package main

import (
	"strings"
	"testing"
)

// TestGenerateDType: `resin generate --model NAME --random-weights ... --dtype bf16|int8`
// runs the llama family, deepseek-v4-flash and glm-5-flash on the CPU with the projections
// in that dtype and says so at startup; bf16 of deepseek-v4-flash's config generates what
// fp32 does on these three tokens (measured; int8 differs in its last one). --dtype is
// refused where nothing holds another dtype (no --model, --device cuda, speculative
// decoding, split runners) and a dtype ref does not know is named. Before, cmd/resin had
// no --dtype ("unknown flag").
func TestGenerateDType(t *testing.T) {
	models := map[string]string{
		"llama":             tinyLlama,
		"deepseek-v4-flash": "../../models/deepseek-v4-flash/config.json",
		"glm-5-flash":       "../../models/glm-5-flash/config.json",
	}
	for name, cfg := range models {
		base := []string{"--model", name, "--random-weights", cfg, "--prompt-ids", "1,2,3", "--max-tokens", "3"}
		want, _, err := runGenerate(t, append(base, "--dtype", "fp32")...)
		if err != nil {
			t.Fatalf("%s fp32: %v", name, err)
		}
		for _, dt := range []string{"bf16", "int8"} {
			out, errOut, err := runGenerate(t, append(base, "--dtype", dt)...)
			if err != nil {
				t.Fatalf("%s %s: %v", name, dt, err)
			}
			if !strings.Contains(errOut, "note: CPU weights "+dt+":") {
				t.Errorf("%s %s: no startup note naming the dtype's kernel in %q", name, dt, errOut)
			}
			if !strings.Contains(out, "3 generated tokens") {
				t.Errorf("%s %s: output %q", name, dt, out)
			}
			if name == "deepseek-v4-flash" && dt == "bf16" && tokensLine(out) != tokensLine(want) {
				t.Errorf("%s bf16 generated %q, fp32 %q", name, tokensLine(out), tokensLine(want))
			}
		}
	}
	ds := []string{"--model", "deepseek-v4-flash", "--random-weights", models["deepseek-v4-flash"], "--prompt-ids", "1,2", "--max-tokens", "1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt-ids", "1,2", "--dtype", "int8"}, "needs --model"},
		{append(ds, "--dtype", "fp4"), `dtype "fp4"`},
		{append(ds, "--dtype", "int8", "--device", "cuda"), "only the CPU runner"},
		{append(ds, "--dtype", "bf16", "--num-speculative-tokens", "1"), "speculative runners run fp32 only"},
		{append(ds, "--dtype", "int8", "--tp", "2"), "split runners"},
	} {
		_, _, err := runGenerate(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one naming %q", c.args, err, c.want)
		}
	}
}
