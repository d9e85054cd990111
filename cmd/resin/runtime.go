package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/tokenizer"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models"
	"github.com/spf13/cobra"
)

// runtimeFlags is resin's cli.Loader: they choose the runner (the engine's test runner,
// or a registered model with its weights) and the tokenizer for serve and generate.
type runtimeFlags struct {
	changed       func(flag string) bool // whether the command line gave flag (nil: none known)
	runner        string
	model         string
	weights       string
	randomWeights string
	cacheBytes    int64
	tokenizerDir  string
	servedName    string
	maxContext    int
	cachePages    int
	specTokens    int
	spec          cli.SpeculativeFlags
	tp            tpFlags
	dp            dpFlags
	cp            cpFlags
	dpRanks       *cli.DPRanks        // what openModel opened for --dp
	promptCheck   func([]int32) error // what openModel's model refuses of a prompt (promptCheck)
	device        cli.DeviceFlags
	remote        cli.RemoteFlags
	dtype         string    // --dtype as given
	dt            ref.DType // --dtype parsed (checkDType)
}

var _ cli.Loader = (*runtimeFlags)(nil)

// Register adds the flags that choose the runner and the tokenizer to cmd.
func (f *runtimeFlags) Register(cmd *cobra.Command) {
	fl := cmd.Flags()
	f.changed = fl.Changed
	validate := cmd.Args
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		// Before the arguments' count: "--random-weights --tp 2 PROMPT" took --tp for the
		// path and left "2" as an extra argument, which was all the error said.
		for _, v := range []struct{ flag, value, want string }{{"--weights", f.weights, "DIR"}, {"--random-weights", f.randomWeights, "CONFIG"}} {
			if strings.HasPrefix(v.value, "-") {
				return fmt.Errorf("%s %s: want a %s path, not a flag (was the path left out?)", v.flag, v.value, v.want)
			}
		}
		if validate != nil {
			return validate(cmd, args)
		}
		return nil
	}
	fl.StringVar(&f.model, "model", "", "checkpoint directory to run, its model picked by the architectures of its config.json (a scaffolded runtime's spelling; the same as --model auto --weights DIR); or a registered model NAME (see models/registry.go) with --weights or --random-weights; default: the engine's deterministic test runner")
	fl.StringVar(&f.weights, "weights", "", "with --model NAME or auto: HF checkpoint directory (config.json, safetensors, tokenizer.json and tokenizer_config.json when present)")
	fl.StringVar(&f.randomWeights, "random-weights", "", "with --model: run the model's seeded random weights of this config.json instead of a checkpoint")
	fl.Int64Var(&f.cacheBytes, "cache-bytes", 0, "with --model: KV cache pool size in bytes (0 = the model's default)")
	fl.StringVar(&f.runner, "runner", "test", "runner when no --model is given: 'test' is the engine's deterministic test runner; exec:'CMD ...' starts an out-of-process runner speaking the runner protocol on its stdin/stdout (python -m resin_runner.llama --weights DIR), unix:PATH connects to one listening there")
	f.remote.Register(cmd)
	fl.StringVar(&f.tokenizerDir, "tokenizer", "", "directory with tokenizer.json (and tokenizer_config.json for chat); default: the one in --weights, else the built-in tiny tokenizer")
	fl.StringVar(&f.servedName, "served-model-name", "", "model name served in /v1/models and expected in requests (default: the --model name, else resin-test)")
	fl.IntVar(&f.maxContext, "max-context", 4096, "maximum context (prompt + output tokens) of the test runner")
	fl.IntVar(&f.cachePages, "cache-pages", 8192, "cache pages of the test runner's pool (16 tokens each)")
	fl.IntVar(&f.specTokens, "num-speculative-tokens", 0, "with --model: decode speculatively with this many draft tokens per step from the model's own draft head (MTP); 0 = off")
	f.spec.Register(cmd)
	f.tp.register(cmd)
	f.dp.register(cmd)
	f.cp.register(cmd)
	f.device.Register(cmd)
	fl.StringVar(&f.dtype, "dtype", "fp32", "with --model on the CPU: the projections' weights in fp32, bf16 (half the bytes), int8 (blocks of 32 quantised at load, as Q8_0) or fp8 (e4m3 in 128×128 blocks; the MoE models' FP8 and MXFP4 tensors as shipped)")
}

// Load loads the tokenizer and the runner. Notes (a fallback worth knowing about) go to
// warn.
func (f *runtimeFlags) Load(warn io.Writer) (*cli.Runtime, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	f.tp.statsOut = warn
	f.device.Log = warn // the GPU runners' notes beside the others
	rt := &cli.Runtime{}
	tokDir := f.tokenizerDir
	if tokDir == "" && f.weights != "" {
		if _, err := os.Stat(filepath.Join(f.weights, "tokenizer.json")); err == nil {
			tokDir = f.weights
		} else {
			fmt.Fprintf(warn, "resin: no tokenizer.json in %s: using the built-in tiny tokenizer (pass --tokenizer DIR)\n", f.weights)
		}
	}
	var err error
	if tokDir == "" {
		rt.Tokenizer, rt.Chat, err = tiny.Load()
	} else {
		rt.Tokenizer, rt.Chat, err = cli.LoadTokenizer(tokDir)
	}
	if err != nil {
		return nil, err
	}
	if f.model == "" && cli.IsRemoteRunner(f.runner) {
		if rt.Runner, rt.Pool, err = f.remote.Open(f.runner, warn); err != nil {
			return nil, err
		}
		rt.RunnerName = rt.Runner.Info().Name
	} else if f.model == "" {
		if f.runner != "test" {
			return nil, fmt.Errorf("unknown runner %q (available: test, exec:'CMD ...', unix:PATH; real models run with --model NAME)", f.runner)
		}
		tr, err := enginetest.New(enginetest.Config{
			VocabSize: rt.Tokenizer.VocabSize(), MaxContext: f.maxContext, EOS: endTokens(rt.Tokenizer), Pages: f.cachePages,
		})
		if err != nil {
			return nil, err
		}
		rt.Runner, rt.Pool, rt.RunnerName = tr, tr.Pool(), "test"
		fmt.Fprintln(warn, "resin: no --model: the engine's built-in test runner answers with deterministic pseudo-random tokens, not a language model (run one with --model CHECKPOINT_DIR)")
	} else if rt.Runner, rt.Pool, rt.RunnerName, err = f.openModel(); err != nil {
		return nil, err
	}
	if v := rt.Runner.Info().VocabSize; tokDir == "" && f.randomWeights != "" && v > 0 && v < rt.Tokenizer.VocabSize() {
		// Seeded random weights of a small config (the in-tree ones have 512 tokens): the
		// built-in tokenizer cut to the model's vocabulary, so that text prompts run. Below
		// its byte tokens' size (the parity configs' 128 and 256) there is no tokenizer:
		// token ids still run, a text prompt is refused as needing one.
		if v < tiny.MinSize {
			rt.Tokenizer, rt.Chat = nil, nil
			fmt.Fprintf(warn, "resin: the model's %d tokens are fewer than the built-in tokenizer's %d byte and special tokens: no tokenizer (run --prompt-ids, or pass --tokenizer DIR)\n", v, tiny.MinSize)
		} else {
			if rt.Tokenizer, rt.Chat, err = tiny.LoadVocab(v); err != nil {
				rt.DP = f.dpRanks
				return nil, errors.Join(err, rt.Close())
			}
			fmt.Fprintf(warn, "resin: the built-in tiny tokenizer cut to the model's %d tokens (its first merges; pass --tokenizer DIR for the model's own)\n", v)
		}
	}
	if f.model != "" && f.dt != "" && f.dt != ref.DTypeFP32 {
		fmt.Fprintf(warn, "note: CPU weights %s\n", f.dt.Kernel())
	}
	rt.DP = f.dpRanks
	rt.CheckPrompt = f.promptCheck
	rt.Served = f.servedName
	if rt.Served == "" {
		rt.Served = "resin-test"
		if f.model != "" || cli.IsRemoteRunner(f.runner) {
			rt.Served = rt.RunnerName
		}
	}
	return rt, nil
}

// check rejects flag combinations that would be silently ignored. It reads --model DIR, a
// directory with config.json that is no registered model's name, as --model auto
// --weights DIR: the spelling of a scaffolded runtime's --model.
func (f *runtimeFlags) check() error {
	if err := f.device.Check(); err != nil {
		return err
	}
	if err := f.checkSpeculative(); err != nil {
		return err
	}
	if err := f.dp.check(f); err != nil {
		return err
	}
	if err := f.cp.check(f); err != nil {
		return err
	}
	if err := f.checkDType(); err != nil {
		return err
	}
	epn := f.tp.ep
	if f.dp.attention {
		epn = f.dp.size // DP-attention's MoE layers run expert parallel over the dp ranks
	}
	if err := checkDispatch(f.tp.dispatch, epn); err != nil {
		return err
	}
	if f.model != "" && f.model != "auto" && f.weights == "" && f.randomWeights == "" {
		if _, lerr := models.Lookup(f.model); lerr != nil {
			if st, err := os.Stat(f.model); err == nil && st.IsDir() {
				if _, err := os.Stat(filepath.Join(f.model, "config.json")); err != nil {
					return fmt.Errorf("--model %s is a directory without config.json, so no checkpoint; as a model name: %w", f.model, lerr)
				}
				f.model, f.weights = "auto", f.model
			}
		}
	}
	if f.model == "" && f.device.CUDA() {
		return errors.New("--device cuda needs --model NAME: the engine's test runner has no GPU path")
	}
	if f.model == "" {
		switch {
		case f.weights != "" || f.randomWeights != "":
			return errors.New("--weights and --random-weights need --model NAME (or --model auto)")
		case f.cacheBytes != 0:
			return errors.New("--cache-bytes sizes a --model runner's pool; the test runner's is --cache-pages")
		case f.specTokens != 0:
			return errors.New("--num-speculative-tokens needs --model NAME: drafts come from the model's own draft head")
		case f.tp.size != 1 || f.tp.ep != 1:
			return errors.New("--tp needs --model llama (or deepseek-v4-flash, glm-5-flash, which --ep needs too): the test runner is not split")
		}
		return nil
	}
	given := func(name string) bool { return f.changed != nil && f.changed(name) }
	parallel := f.tp.size > 1 || f.tp.ep > 1 || f.dp.size > 1 || f.cp.size > 1
	switch {
	case f.tp.initAddr != "" && !parallel: // before tp.check, which would name an empty layout
		return fmt.Errorf("--dist-init-addr %s: nothing to spread over nodes without --tp, --ep, --cp or --dp N --dp-attention", f.tp.initAddr)
	case f.tp.check() != nil:
		return f.tp.check()
	case given("max-context") || given("cache-pages"):
		return errors.New("--max-context and --cache-pages size the test runner; with --model the model's config sets the context and --cache-bytes the cache")
	case given("dist-timeout") && f.tp.initAddr == "":
		return errors.New("--dist-timeout bounds a multi-node rendezvous: it needs --dist-init-addr (or a launcher's environment)")
	case (f.tp.size > 1 || f.tp.ep > 1) && f.specTokens > 0 && !moeParallelModels[f.model]:
		return fmt.Errorf("%s with --num-speculative-tokens: only deepseek-v4-flash and glm-5-flash draft under a parallel layout (their MTP heads split), not %s", layoutSpelling(f.tp.size, f.tp.ep, 1), f.model)
	case (f.tp.size > 1 || f.tp.ep > 1) && f.device.CUDA() && gpuLayoutOpeners[f.model] != nil && f.tp.dispatch != "gather" && !f.gpuParallel():
		return fmt.Errorf("--ep-dispatch %s with --device cuda: the GPU layouts dispatch by gather, or the MoE models' --ep (alone or with --tp equal) by either (in-process ranks, --tp-procs, or nodes without --tp-procs): use --ep-dispatch gather (the all-to-all dispatch of other layouts runs on the CPU)", f.tp.dispatch)
	case (f.tp.size > 1 || f.tp.ep > 1) && f.device.CUDA() && !f.gpuParallel() && (f.tp.procs || f.tp.initAddr != ""):
		return fmt.Errorf("%s with --device cuda and --tp-procs or --dist-init-addr: %s has no such GPU layout (llama: --tp; deepseek-v4-flash, glm-5-flash: --tp, --ep or both equal)", layoutSpelling(f.tp.size, f.tp.ep, 1), f.model)
	case (f.tp.size > 1 || f.tp.ep > 1) && f.device.CUDA() && !f.gpuParallel():
		return fmt.Errorf("%s with --device cuda: the GPU layouts cover --model llama (--tp) and glm-5-flash and deepseek-v4-flash (--tp, --ep, --ep-dispatch gather), in-process ranks, --tp-procs or --dist-init-addr; the others run on the CPU", layoutSpelling(f.tp.size, f.tp.ep, 1))
	case f.tp.size > 1 && f.tp.ep > 1 && f.tp.size != f.tp.ep && f.device.CUDA():
		return fmt.Errorf("--tp %d --ep %d with --device cuda: the GPU layout splits the same ranks both ways, so --tp and --ep must be equal there; different sizes run on the CPU", f.tp.size, f.tp.ep)
	case f.specTokens < 0:
		return fmt.Errorf("--num-speculative-tokens %d is negative", f.specTokens)
	case f.runner != "test":
		return fmt.Errorf("--runner %s and --model %s are exclusive", f.runner, f.model)
	case f.weights != "" && f.randomWeights != "":
		return errors.New("--weights and --random-weights are exclusive: pick a checkpoint or random weights")
	case f.weights == "" && f.randomWeights == "":
		return fmt.Errorf("--model %s needs --weights DIR (a checkpoint) or --random-weights CONFIG", f.model)
	case f.cacheBytes < 0:
		return fmt.Errorf("--cache-bytes %d is negative", f.cacheBytes)
	case f.weights != "":
		return checkCheckpoint(f.weights)
	}
	return nil
}

// openModel resolves --model and opens it on the checkpoint of --weights, or on a
// directory holding only the --random-weights config (the registry's models then build
// their seeded random weights).
func (f *runtimeFlags) openModel() (engine.Runner, *kvslab.Pool, string, error) {
	dir := f.weights
	if dir == "" {
		cfg, err := os.ReadFile(f.randomWeights)
		if err != nil {
			return nil, nil, "", fmt.Errorf("--random-weights: %w", err)
		}
		if dir, err = os.MkdirTemp("", "resin-random-weights-"); err != nil {
			return nil, nil, "", fmt.Errorf("--random-weights: %w", err)
		}
		// Open reads the config and builds the weights in memory; nothing in dir is used
		// afterwards.
		defer os.RemoveAll(dir)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
			return nil, nil, "", fmt.Errorf("--random-weights: %w", err)
		}
	}
	m, err := resolveModel(f.model, dir)
	if err != nil {
		if f.weights == "" {
			err = namedAs(err, dir, f.randomWeights)
		}
		return nil, nil, "", err
	}
	var r engine.Runner
	var pool *kvslab.Pool
	switch {
	case f.tp.stats && (m.Name != "llama" || f.device.CUDA() || f.dp.size > 1 || f.cp.size > 1 || f.spec.DSpark()):
		return nil, nil, "", fmt.Errorf("--dist-stats covers --model llama's CPU tensor parallelism only (not %s, --device cuda, --dp, --cp or DSpark)", m.Name)
	case f.spec.DSpark():
		r, pool, err = f.openDSpark(m, dir)
	case f.dp.size > 1:
		r, pool, f.dpRanks, err = f.openDP(m, dir)
	case f.cp.size > 1 && f.tp.size > 1 && m.Name != "llama":
		return nil, nil, "", fmt.Errorf("--cp %d --tp %d: CP over tensor-parallel groups covers the llama family so far, not %s", f.cp.size, f.tp.size, m.Name)
	case f.cp.size > 1 && f.tp.size > 1 && f.device.CUDA():
		r, pool, err = f.openCPTPGPU(dir)
	case f.cp.size > 1 && f.tp.size > 1:
		r, pool, err = openCPTP(dir, f.cacheBytes, f.cp.size, f.tp.size, f.cp.procs || f.tp.procs, f.cpNodes())
	case f.cp.size > 1 && f.device.CUDA():
		r, pool, err = f.openCPGPU(m.Name, dir)
	case f.cp.size > 1 && cpModels[m.Name].rank != nil:
		r, pool, err = openCPModel(m.Name, dir, f.cacheBytes, f.cp.size, f.cp.procs, f.cpNodes())
	case f.cp.size > 1 && m.Name != "llama":
		return nil, nil, "", fmt.Errorf("--cp %d: context parallelism covers the llama family, deepseek-v4-flash and glm-5-flash only so far, not %s", f.cp.size, m.Name)
	case f.cp.size > 1:
		r, pool, err = openCP(dir, f.cacheBytes, f.cp.size, f.cp.procs, f.cpNodes())
	case (f.tp.size > 1 || f.tp.ep > 1) && f.device.CUDA() && gpuLayoutOpeners[m.Name] != nil:
		r, pool, err = f.openLayoutGPU(m.Name, dir)
	case (f.tp.size > 1 || f.tp.ep > 1) && moeParallelModels[m.Name]:
		r, pool, err = openMoEParallel(m.Name, dir, f.cacheBytes, f.specTokens, &f.tp)
	case f.tp.ep > 1:
		return nil, nil, "", fmt.Errorf("--ep %d: expert parallelism covers deepseek-v4-flash and glm-5-flash only, not %s", f.tp.ep, m.Name)
	case f.tp.size > 1 && m.Name != "llama":
		return nil, nil, "", fmt.Errorf("--tp %d: tensor parallelism covers the llama family, deepseek-v4-flash and glm-5-flash only so far, not %s", f.tp.size, m.Name)
	case f.tp.size > 1 && f.device.CUDA():
		r, pool, err = f.openTPGPU(m.Name, dir)
	case f.tp.size > 1:
		r, pool, err = openTP(dir, f.cacheBytes, &f.tp)
	case f.device.CUDA() && f.specTokens > 0 && gpuSpecOpeners[m.Name] != nil:
		spec := gpuSpecOpeners[m.Name]
		r, pool, err = f.device.OpenGPU(m.Name, func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
			return spec(dir, cacheBytes, opts, f.specTokens)
		}, dir, f.cacheBytes)
	case f.device.CUDA() && f.specTokens > 0:
		return nil, nil, "", fmt.Errorf("--num-speculative-tokens %d: the GPU runner of %s does not decode speculatively yet; use --device cpu", f.specTokens, m.Name)
	case f.device.CUDA():
		r, pool, err = f.device.OpenGPU(m.Name, gpuOpeners[m.Name], dir, f.cacheBytes)
	case f.dt != "" && f.dt != ref.DTypeFP32 && m.OpenDType == nil:
		return nil, nil, "", fmt.Errorf("--dtype %s: model %s runs fp32 only", f.dt, m.Name)
	case f.dt != "" && f.dt != ref.DTypeFP32:
		r, pool, err = m.OpenDType(dir, f.cacheBytes, string(f.dt))
	case f.specTokens <= 0:
		r, pool, err = m.Open(dir, f.cacheBytes)
	case m.OpenSpeculative == nil:
		return nil, nil, "", fmt.Errorf("--num-speculative-tokens %d: model %s has no draft head to propose drafts", f.specTokens, m.Name)
	default:
		r, pool, err = m.OpenSpeculative(dir, f.cacheBytes, f.specTokens)
	}
	if err != nil {
		if f.weights == "" {
			err = namedAs(err, dir, f.randomWeights)
		}
		return nil, nil, "", fmt.Errorf("open model %s: %w", m.Name, err)
	}
	// What the model refuses of a prompt, for every engine (its runner may be wrapped, and
	// the dp ranks' are): read before dir (a --random-weights copy) is removed.
	f.promptCheck = promptCheck(m.Name, dir)
	return r, pool, m.Name, nil
}

// namedAs is err with the temporary directory dir, which holds a copy of the
// --random-weights config, named as the file the user passed: the memory refusal of a
// full-size config, or a parse error, then points at a file the user can edit.
func namedAs(err error, dir, config string) error {
	return renamedError{err, strings.NewReplacer(filepath.Join(dir, "config.json"), config, dir, config)}
}

// renamedError is an error whose message has paths replaced; errors.Is and As still see
// the original.
type renamedError struct {
	err error
	r   *strings.Replacer
}

func (e renamedError) Error() string { return e.r.Replace(e.err.Error()) }
func (e renamedError) Unwrap() error { return e.err }

// checkCheckpoint makes sure dir is a checkpoint with config.json and safetensors, so that
// a model that falls back to random weights never does so for a mistyped --weights.
func checkCheckpoint(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("--weights: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("--weights %s is not a directory (for random weights of a config.json use --random-weights)", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("--weights: %s holds no config.json: %w", dir, err)
	}
	ck, err := weights.Open(dir)
	if errors.Is(err, weights.ErrNotFound) {
		return fmt.Errorf("--weights: %s is not a complete safetensors checkpoint (for random weights of its config use --random-weights %s): %w",
			dir, filepath.Join(dir, "config.json"), err)
	}
	if err != nil {
		return fmt.Errorf("--weights: %w", err)
	}
	return ck.Close()
}

// resolveModel returns the registered model called name, or for "auto" the one that loads
// an architecture listed in dir/config.json.
func resolveModel(name, dir string) (models.Model, error) {
	if name != "auto" {
		return models.Lookup(name)
	}
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return models.Model{}, fmt.Errorf("--model auto: %w", err)
	}
	var cfg struct {
		Architectures []string `json:"architectures"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return models.Model{}, fmt.Errorf("--model auto: parse %s: %w", path, err)
	}
	if len(cfg.Architectures) == 0 {
		return models.Model{}, fmt.Errorf("--model auto: %s lists no architectures; pass --model NAME", path)
	}
	var first error
	for _, a := range cfg.Architectures {
		m, err := models.ForArchitecture(a)
		if err == nil {
			return m, nil
		}
		if first == nil {
			first = err
		}
	}
	return models.Model{}, fmt.Errorf("--model auto: %w", first)
}

// endTokens lists the end-of-turn / end-of-text tokens the vocabulary has: the test runner
// stops at any of them.
func endTokens(tok *tokenizer.Tokenizer) []int32 {
	var ids []int32
	for _, name := range []string{"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|eom_id|>"} {
		if id, ok := tok.TokenID(name); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// cpNodes is the multi-node layout of --cp (--dist-init-addr, or the launchers'
// environment), or nil for ranks of this host.
func (f *runtimeFlags) cpNodes() *tpFlags {
	if f.tp.initAddr == "" {
		return nil
	}
	return &f.tp
}
