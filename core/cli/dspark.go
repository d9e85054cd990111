package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// DSparkOpener opens a model whose checkpoint holds its own DSpark drafter stages
// (DeepSeek-V4-Flash-DSpark) drafting with them: at most drafts per block (0: as many as
// the block allows), cut by confidence (0: full blocks); trace, when set, is called once
// per verification per sequence.
type DSparkOpener func(dir string, cacheBytes int64, drafts int, confidence float32, trace func(dspark.TraceEntry)) (engine.Runner, *kvslab.Pool, error)

// WithDSpark gives the model's DSpark opener: the commands then take
// --speculative-method dspark, --dspark-confidence and --spec-trace (with
// --num-speculative-tokens for the drafts per block; no --draft-model: the stages are the
// checkpoint's).
func (m *ModelDir) WithDSpark(open DSparkOpener) *ModelDir {
	m.dspark = open
	return m
}

// openDSpark opens the model through its DSparkOpener after checking the flags.
func (m *ModelDir) openDSpark() (engine.Runner, *kvslab.Pool, error) {
	if m.dspark == nil {
		return nil, nil, fmt.Errorf("--speculative-method dspark: %s has no DSpark drafter", m.name)
	}
	trace, err := m.specFlags.OwnDrafter(m.name, m.device)
	if err != nil {
		return nil, nil, err
	}
	return m.dspark(m.dir, m.cacheBytes, m.specTokens, float32(m.specFlags.Confidence), trace)
}

// OwnDrafter checks --speculative-method dspark for model name, whose checkpoint holds its
// own DSpark drafter stages and which drafts on the CPU runner only: a --draft-model or a
// CUDA device is refused by name. It returns the --spec-trace hook (nil without the flag).
func (f *SpeculativeFlags) OwnDrafter(name string, device DeviceFlags) (func(dspark.TraceEntry), error) {
	switch {
	case f.DraftModel != "":
		return nil, fmt.Errorf("--draft-model %s: %s's DSpark drafter is in its checkpoint: drop --draft-model", f.DraftModel, name)
	case device.CUDA():
		return nil, fmt.Errorf("--speculative-method dspark: %s drafts on the CPU runner only so far; drop --device", name)
	case f.Trace == "":
		return nil, nil
	}
	return SpecTrace(f.Trace)
}

// SpecTrace opens path for --spec-trace and returns a DSpark trace hook writing one JSON
// line per verification to it; the file stays open for the life of the process (each
// line is one write, so what a run traced is there when it stops). A write that fails
// stops the tracing and says so once on stderr.
func SpecTrace(path string) (func(dspark.TraceEntry), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--spec-trace: %w", err)
	}
	var mu sync.Mutex
	failed := false
	return func(e dspark.TraceEntry) {
		mu.Lock()
		defer mu.Unlock()
		if failed {
			return
		}
		line, _ := json.Marshal(e)
		if _, err := f.Write(append(line, '\n')); err != nil {
			failed = true
			fmt.Fprintf(os.Stderr, "resin: --spec-trace %s: %v; tracing stopped\n", path, err)
		}
	}, nil
}
