package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// ModelDir is the Loader of a runtime built for one model: --model DIR holds config.json
// and the safetensors (or only config.json, for the model's seeded random weights) and,
// when it has one, tokenizer.json with tokenizer_config.json. A directory whose weights
// are in another format (pytorch_model.bin, *.pt) is refused unless --random-weights asks
// for random weights: only safetensors are loaded.
type ModelDir struct {
	name string
	open Opener
	spec SpeculativeOpener
	gpu  GPUOpener
	// gpuSpec opens the model on the GPU decoding speculatively (nil: the GPU runner does
	// not draft).
	gpuSpec GPUSpeculativeOpener
	// dspark opens the model drafting with its own DSpark stages (nil: none; dspark.go).
	dspark    DSparkOpener
	specFlags SpeculativeFlags

	dtypeOpen DTypeOpener
	dtype     string

	device DeviceFlags

	specTokens    int
	randomWeights bool

	dir, tokPath, chatPath, served string
	cacheBytes                     int64
}

// NewModelDir returns the Loader of the model called name, opened by open.
func NewModelDir(name string, open Opener) *ModelDir {
	return &ModelDir{name: name, open: open}
}

// WithSpeculative gives the model's speculative opener: the commands then take
// --num-speculative-tokens.
func (m *ModelDir) WithSpeculative(open SpeculativeOpener) *ModelDir {
	m.spec = open
	return m
}

// Register adds --model, --cache-bytes, --tokenizer, --chat-template and
// --served-model-name to cmd (and --num-speculative-tokens for a model with a draft head,
// on the CPU or the GPU).
func (m *ModelDir) Register(cmd *cobra.Command) {
	fl := cmd.Flags()
	if m.spec != nil || m.gpuSpec != nil {
		fl.IntVar(&m.specTokens, "num-speculative-tokens", 0, "decode speculatively with this many draft tokens per step from the model's draft head (MTP); 0 = off")
	}
	fl.StringVar(&m.dir, "model", ".", "model directory: config.json and safetensors (none: seeded random weights)")
	fl.BoolVar(&m.randomWeights, "random-weights", false, "run seeded random weights of --model's config.json even though it holds weights in a format Resin does not load (*.bin, *.pt)")
	fl.Int64Var(&m.cacheBytes, "cache-bytes", 64<<20, "KV cache pool size in bytes")
	fl.StringVar(&m.tokPath, "tokenizer", "", "tokenizer.json, or a directory holding it (default: the one in --model, if any)")
	fl.StringVar(&m.chatPath, "chat-template", "", "tokenizer_config.json holding the chat template (default: the one beside the tokenizer)")
	fl.StringVar(&m.served, "served-model-name", "", "model name served in /v1/models and expected in requests (default: "+m.name+")")
	if m.dtypeOpen != nil {
		fl.StringVar(&m.dtype, "dtype", "fp32", "CPU weights: fp32, bf16 (half the bytes), int8 (blocks of 32 quantised at load, as Q8_0) or fp8 (e4m3 in 128×128 blocks; the MoE models' FP8 and MXFP4 tensors as shipped)")
	}
	if m.dspark != nil {
		m.specFlags.Register(cmd)
	}
	m.device.Register(cmd)
}

// Load opens the model and its tokenizer, if it has one.
func (m *ModelDir) Load(warn io.Writer) (*Runtime, error) {
	if m.open == nil {
		return nil, fmt.Errorf("model %s: no opener", m.name)
	}
	if m.cacheBytes < 0 {
		return nil, fmt.Errorf("--cache-bytes %d is negative", m.cacheBytes)
	}
	if st, err := os.Stat(m.dir); err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("--model %s is not a directory (it holds config.json and the safetensors)", m.dir)
	}
	rt := &Runtime{Served: m.served, RunnerName: m.name}
	if rt.Served == "" {
		rt.Served = m.name
	}
	tokPath := m.tokPath
	if tokPath == "" {
		if _, err := os.Stat(filepath.Join(m.dir, "tokenizer.json")); err == nil {
			tokPath = m.dir
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("--model: %w", err)
		}
	}
	if tokPath != "" {
		var err error
		if rt.Tokenizer, rt.Chat, err = LoadTokenizer(tokPath); err != nil {
			return nil, err
		}
	}
	if m.chatPath != "" {
		if _, err := os.Stat(m.chatPath); err != nil {
			return nil, fmt.Errorf("--chat-template: %w", err)
		}
		chat, err := LoadChatTemplate(m.chatPath)
		if err != nil {
			return nil, err
		}
		if chat == nil {
			return nil, fmt.Errorf("--chat-template %s: no chat template in it", m.chatPath)
		}
		rt.Chat = chat
	}
	if err := m.checkWeights(warn); err != nil {
		return nil, err
	}
	if m.specTokens < 0 {
		return nil, fmt.Errorf("--num-speculative-tokens %d is negative", m.specTokens)
	}
	if err := m.device.Check(); err != nil {
		return nil, err
	}
	dt, err := m.checkDType()
	if err != nil {
		return nil, err
	}
	if m.dspark != nil {
		if err := m.specFlags.Check(m.specTokens); err != nil {
			return nil, err
		}
	}
	if m.specFlags.DSpark() {
		rt.Runner, rt.Pool, err = m.openDSpark()
	} else if m.device.CUDA() {
		rt.Runner, rt.Pool, err = m.openGPU()
	} else if m.specTokens > 0 {
		if m.spec == nil {
			return nil, fmt.Errorf("--num-speculative-tokens: the CPU runner of %s does not decode speculatively; use --device cuda", m.name)
		}
		rt.Runner, rt.Pool, err = m.spec(m.dir, m.cacheBytes, m.specTokens)
	} else if m.dtypeOpen != nil {
		rt.Runner, rt.Pool, err = m.dtypeOpen(m.dir, m.cacheBytes, string(dt))
		if err == nil {
			noteDType(warn, dt)
		}
	} else {
		rt.Runner, rt.Pool, err = m.open(m.dir, m.cacheBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("open model %s in %s: %w", m.name, m.dir, err)
	}
	return rt, nil
}

// openGPU opens the model on the GPU: speculatively through gpuSpec with
// --num-speculative-tokens, else through gpu (or gpuSpec with no drafts).
func (m *ModelDir) openGPU() (engine.Runner, *kvslab.Pool, error) {
	open := m.gpu
	switch {
	case m.specTokens > 0 && m.gpuSpec == nil:
		return nil, nil, fmt.Errorf("--num-speculative-tokens: the GPU runner of %s does not decode speculatively yet; use --device cpu", m.name)
	case m.specTokens > 0 || open == nil && m.gpuSpec != nil:
		drafts := m.specTokens
		open = func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
			return m.gpuSpec(dir, cacheBytes, opts, drafts)
		}
	}
	return m.device.OpenGPU(m.name, open, m.dir, m.cacheBytes)
}

// foreignWeights are the patterns of weight files in formats Resin does not load.
var foreignWeights = []string{"*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf"}

// checkWeights decides between the checkpoint and seeded random weights, which the models
// fall back to when the directory holds no *.safetensors: a checkpoint in another format
// is an error rather than noise, unless --random-weights asks for it, and random weights
// get a note, said before opening (those of a full-size config may not fit in memory).
func (m *ModelDir) checkWeights(warn io.Writer) error {
	shards, err := filepath.Glob(filepath.Join(m.dir, "*.safetensors"))
	if err != nil {
		return fmt.Errorf("--model: %w", err)
	}
	if len(shards) > 0 {
		if m.randomWeights {
			return fmt.Errorf("--random-weights: %s holds safetensors, which the model would load instead; pass a directory holding only config.json", m.dir)
		}
		return nil
	}
	var foreign []string
	for _, pat := range foreignWeights {
		found, err := filepath.Glob(filepath.Join(m.dir, pat))
		if err != nil {
			return fmt.Errorf("--model: %w", err)
		}
		for _, f := range found {
			foreign = append(foreign, filepath.Base(f))
		}
	}
	if len(foreign) > 0 && !m.randomWeights {
		if n := len(foreign); n > 4 {
			foreign = append(foreign[:3], fmt.Sprintf("%d more", n-3))
		}
		return fmt.Errorf("--model %s holds %s but no *.safetensors, and only safetensors are loaded: convert the checkpoint to safetensors "+
			"(transformers: model.save_pretrained(dir, safe_serialization=True)), or pass --random-weights to run seeded random weights of its config.json",
			m.dir, strings.Join(foreign, ", "))
	}
	fmt.Fprintf(warn, "note: %s holds no *.safetensors: %s runs seeded random weights of its config.json\n", m.dir, m.name)
	return nil
}
