package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/serve"
)

// defaultPromptIDs is the prompt of a generate run given neither text nor ids.
var defaultPromptIDs = []int32{1, 2, 3, 4}

// GenerateCmd is `generate`: one prompt through the engine. A text prompt (PROMPT or
// --prompt; needs a tokenizer) streams the generated text to stdout; --prompt-ids (or no
// prompt at all: ids 1,2,3,4) prints the prompt and generated token ids, their text when
// there is a tokenizer, the finish reason and the throughput.
//
// --logits-out FILE.safetensors writes what the model computed for every token it read, to
// compare it with a reference implementation (run the reference on token_ids, compare row
// by row). It needs a runner that implements cpurunner.LogitsCapturer. The file holds
//
//	logits     F32 [tokens, vocab]  row i: the logits after reading token_ids[i] at position i,
//	                                the model's distribution of the token at position i+1
//	token_ids  I64 [tokens]         the prompt, then the generated tokens fed back
//
// and the metadata model, prompt_tokens and completion_tokens. The last generated token is
// sampled from the last row and never fed back, so it has no row: tokens = prompt +
// generated - 1. Each position has exactly one row, however the prompt was chunked.
func GenerateCmd(l Loader) *cobra.Command {
	var ef EngineFlags
	var p serve.GenerateParams
	var prompt, ids, logitsOut string
	var seed int64
	var stats bool
	cmd := &cobra.Command{
		Use:   "generate [flags] [PROMPT]",
		Short: "Generate tokens for one prompt and print them",
		Long:  generateLong,
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if prompt != "" {
					return errors.New("give the prompt once: as PROMPT or as --prompt")
				}
				prompt = args[0]
			}
			if prompt == "" && (len(args) == 1 || cmd.Flags().Changed("prompt")) {
				// An explicit empty text is a mistake (an unset shell variable), not a
				// request for the default prompt ids (vLLM refuses it too).
				return errors.New("the prompt is empty: give text, or --prompt-ids (without either, the default ids 1,2,3,4 run)")
			}
			if prompt != "" && ids != "" {
				return errors.New("a text prompt and --prompt-ids are exclusive")
			}
			if prompt == "" && (p.Chat || p.System != "" || len(p.Stop) > 0) {
				return errors.New("--chat, --system and --stop apply to a text prompt")
			}
			switch {
			case p.MaxTokens == 0:
				return errors.New("--max-tokens 0: a run generates at least one token (-1 generates up to the model's context)")
			case p.MaxTokens == -1:
				p.MaxTokens = 0 // the engine's "up to the context"
			case p.MaxTokens < 0:
				return fmt.Errorf("--max-tokens %d: want a positive count, or -1 for up to the model's context", p.MaxTokens)
			}
			var in []int32
			if prompt == "" {
				in = defaultPromptIDs
				if ids != "" || cmd.Flags().Changed("prompt-ids") { // an explicit "" is no ids, not the default
					var err error
					if in, err = ParseTokenIDs(ids); err != nil {
						return fmt.Errorf("--prompt-ids: %w", err)
					}
				}
			}
			if cmd.Flags().Changed("seed") {
				s := uint64(seed)
				p.Seed = &s
			}
			if logitsOut != "" {
				if err := checkLogitsOut(logitsOut); err != nil {
					return err
				}
			}
			rt, cfg, err := load(cmd, l, &ef)
			if err != nil {
				return err
			}
			if prompt != "" && rt.Tokenizer == nil {
				return errors.New("a text prompt needs a tokenizer (tokenizer.json in the model directory or --tokenizer); use --prompt-ids without one")
			}
			var rec *logitsRecorder
			if logitsOut != "" {
				var done func()
				if rec, done, err = captureLogits(rt); err != nil {
					return err
				}
				defer done()
			}
			e, err := Start(rt, cfg)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			if ctx.Err() != nil {
				// Ended before any request went in: interrupted, whatever a fast engine
				// would have finished before it noticed (the test runner's was racy).
				return errors.Join(errors.New("interrupted"), e.Stop())
			}
			out := cmd.OutOrStdout()
			var n counts
			if prompt != "" {
				p.Prompt = prompt
				n, err = generateText(ctx, rt, e, p, out, stats, cmd.ErrOrStderr())
			} else {
				n, err = generateIDs(ctx, rt, e, in, p, out)
			}
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				// Ctrl-C (or the caller's context): say so, not "context canceled".
				err = errors.New("interrupted")
			}
			if serr := e.Stop(); err == nil {
				err = serr
			}
			if err == nil && rec != nil {
				err = rec.write(logitsOut, rt.RunnerName, n.prompt, n.completion)
			}
			return err
		},
	}
	l.Register(cmd)
	ef.Register(cmd)
	f := cmd.Flags()
	f.StringVar(&prompt, "prompt", "", "prompt text (needs a tokenizer); the same as PROMPT")
	f.StringVar(&ids, "prompt-ids", "", "prompt as comma-separated token ids (default without a text prompt: 1,2,3,4)")
	f.BoolVar(&p.Chat, "chat", false, "render the prompt as a user message with the chat template")
	f.StringVar(&p.System, "system", "", "system message (with --chat)")
	f.IntVar(&p.MaxTokens, "max-tokens", 64, "tokens to generate at most (-1: up to the model's context)")
	f.Float32Var(&p.Temperature, "temperature", 0, "sampling temperature (0 = greedy)")
	f.Int64Var(&seed, "seed", 0, "sampling seed (reproducible output)")
	f.StringSliceVar(&p.Stop, "stop", nil, "stop strings (repeatable)")
	f.BoolVar(&p.IgnoreEOS, "ignore-eos", false, "keep generating past the end-of-sequence token (always so without a tokenizer)")
	f.BoolVar(&stats, "stats", false, "with a text prompt: print the finish reason and token counts to stderr")
	f.StringVar(&logitsOut, "logits-out", "", "write the fp32 logits of every prompt and fed-back generated token to `FILE`.safetensors (tensors logits [tokens, vocab] and token_ids; see --help)")
	return cmd
}

// generateLong is the help of GenerateCmd.
const generateLong = `Runs one prompt through the engine. A text prompt (PROMPT or --prompt; needs a
tokenizer) streams the generated text; --prompt-ids runs token ids and prints the
generated ids, their text when there is a tokenizer, and the throughput.

` + LogitsOutHelp

// LogitsOutHelp is the paragraph of generate's help on --logits-out, for runtimes that
// rewrite that help.
const LogitsOutHelp = `--logits-out FILE.safetensors writes the fp32 logits of every token the model read, to
compare it with a reference implementation run on the same ids:
  logits     F32 [tokens, vocab]  row i: the logits after reading token_ids[i] at position i
                                  (the distribution of the token at position i+1)
  token_ids  I64 [tokens]         the prompt, then the generated tokens fed back
The last generated token is never fed back, so tokens = prompt + generated - 1. The file
appears only when generation succeeds (written to a temporary file, then renamed).`

// counts are the prompt and generated tokens of a generate run.
type counts struct{ prompt, completion int }

// generateText streams the text generated for p to out.
func generateText(ctx context.Context, rt *Runtime, e *Engine, p serve.GenerateParams, out io.Writer, stats bool, errOut io.Writer) (counts, error) {
	srv, err := serve.New(serve.Config{Engine: e.Front(), Tokenizer: rt.Tokenizer, ChatTemplate: rt.Chat, Model: rt.Served})
	if err != nil {
		return counts{}, err
	}
	res, err := srv.Generate(ctx, p, func(text string) error {
		_, werr := fmt.Fprint(out, text)
		return werr
	})
	if err != nil {
		return counts{}, err
	}
	fmt.Fprintln(out)
	if stats {
		fmt.Fprintf(errOut, "finish_reason=%s prompt_tokens=%d completion_tokens=%d\n",
			res.FinishReason, res.PromptTokens, res.CompletionTokens)
	}
	return counts{res.PromptTokens, res.CompletionTokens}, nil
}

// generateIDs runs the token ids in and prints the prompt, the generated ids (and their
// text), the finish reason and the throughput.
func generateIDs(ctx context.Context, rt *Runtime, e *Engine, in []int32, p serve.GenerateParams, out io.Writer) (counts, error) {
	sp := engine.SamplingParams{Temperature: p.Temperature, MaxTokens: p.MaxTokens, IgnoreEOS: p.IgnoreEOS || rt.Tokenizer == nil}
	if p.Seed != nil {
		sp.Seed, sp.HasSeed = *p.Seed, true
	}
	t0 := time.Now()
	s, err := e.Submit(ctx, engine.Request{Prompt: in, Sampling: sp})
	if err != nil {
		return counts{}, err
	}
	toks, ev, err := s.Collect(ctx)
	if err != nil {
		return counts{}, err
	}
	if ev.Err != nil {
		return counts{}, ev.Err
	}
	el := time.Since(t0)
	fmt.Fprintf(out, "prompt: %v\n", in)
	fmt.Fprintf(out, "tokens: %v\n", toks)
	if rt.Tokenizer != nil {
		fmt.Fprintf(out, "text:   %q\n", rt.Tokenizer.Decode(toks, true))
	}
	fmt.Fprintf(out, "finish: %s, %d prompt + %d generated tokens in %v (%.1f tokens/s)\n",
		ev.Finish, ev.Usage.PromptTokens, ev.Usage.CompletionTokens, el.Round(time.Millisecond),
		float64(len(toks))/el.Seconds())
	writeSpecStats(out, e.Engine)
	return counts{ev.Usage.PromptTokens, ev.Usage.CompletionTokens}, nil
}

// ParseTokenIDs parses comma-separated token ids ("1, 2,3").
func ParseTokenIDs(s string) ([]int32, error) {
	var ids []int32
	if strings.Trim(s, ", \t\n") == "" {
		return nil, errors.New("no token ids")
	}
	// One trailing comma ("5,6,", as a loop printing "id," writes) ends the list.
	s = strings.TrimSuffix(strings.TrimRight(s, " \t\n"), ",")
	for i, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" { // "5,,6" is a typo, not the prompt 5, 6
			return nil, fmt.Errorf("token id %d of %q is empty", i+1, s)
		}
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a token id", f)
		}
		ids = append(ids, int32(n))
	}
	if len(ids) == 0 {
		return nil, errors.New("no token ids")
	}
	return ids, nil
}
