package cli

import (
	"errors"
	"io"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/tokenizer"
)

// Opener opens the checkpoint in dir (config.json and safetensors; a model may fall back
// to seeded random weights when dir holds no safetensors) and returns its runner with a
// cache pool of cacheBytes bytes (0 = the model's default). It is the shape of a model
// package's Open and of models.Model.Open.
type Opener func(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error)

// SpeculativeOpener opens a model that decodes speculatively with drafts draft tokens per
// step from its own draft head (an MTP layer).
type SpeculativeOpener func(dir string, cacheBytes int64, drafts int) (engine.Runner, *kvslab.Pool, error)

// Runtime is a loaded model: what the commands put behind an engine.
type Runtime struct {
	Runner engine.Runner
	// Pool is the runner's cache pool (nil: the engine builds one in host memory).
	Pool *kvslab.Pool
	// Tokenizer is nil when the model comes without one: commands then take token ids.
	Tokenizer *tokenizer.Tokenizer
	// Chat is the chat template (nil: none).
	Chat *tokenizer.ChatTemplate
	// Served is the model name the API serves; RunnerName says what runs, for logs.
	Served     string
	RunnerName string
	// DP, when set (--dp N), holds the data-parallel ranks after rank 0, whose Runner
	// and Pool are the fields above: Start runs one engine per rank behind a
	// dp.Coordinator.
	DP *DPRanks
	// CheckPrompt, when set, refuses prompts in every engine Start runs (its
	// engine.Config.CheckPrompt): the model's own check where its runner is wrapped (a
	// parallel layout's rank 0, the data-parallel ranks' forwards).
	CheckPrompt func(prompt []int32) error
}

// DPRanks are a Runtime's data-parallel ranks 1..N-1: a runner and a cache pool each.
type DPRanks struct {
	Runners []engine.Runner
	Pools   []*kvslab.Pool
	// Group, when set (--dp-attention), steps every rank's engine together; rank r's
	// runner runs through Group.Forward(r). Nil: the ranks are replicas.
	Group *dp.Group
	// Close, when set, frees what the ranks hold (their GPU runners, devices and NCCL
	// communicator) once the group is closed.
	Close func() error
}

// Close ends what rt holds when no engine was started on it (a load that failed after
// its runner opened): its runners' ranks, worker processes and devices, and its dp
// group, as an engine's stop ends them.
func (rt *Runtime) Close() error {
	runners := []engine.Runner{rt.Runner}
	if rt.DP != nil {
		runners = append(runners, rt.DP.Runners...)
	}
	var errs []error
	for _, r := range runners {
		if r == nil {
			continue
		}
		if c := runnerCloser(r); c != nil {
			errs = append(errs, c())
		}
	}
	if rt.DP != nil && rt.DP.Group != nil {
		errs = append(errs, rt.DP.Group.Close())
	}
	if rt.DP != nil && rt.DP.Close != nil {
		errs = append(errs, rt.DP.Close())
	}
	return errors.Join(errs...)
}

// Loader chooses a model from command-line flags and loads it. Register adds its flags to
// a command; Load, called when the command runs, writes notes worth knowing about (a
// fallback taken) to warn.
type Loader interface {
	Register(cmd *cobra.Command)
	Load(warn io.Writer) (*Runtime, error)
}
