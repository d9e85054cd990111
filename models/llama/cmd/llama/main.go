// Command llama serves, generates with and benchmarks the llama model on Resin's
// engine. With no safetensors in --model it runs seeded random weights of config.json.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/serve"
	"github.com/resin-llm/resin/core/tokenizer"

	model "github.com/resin-llm/resin/models/llama"
	"github.com/resin-llm/resin/models/llama/kernels"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "llama:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "llama",
		Short:         "The llama inference runtime (Resin)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var cpuProf, memProf string
	var cpuFile *os.File
	root.PersistentFlags().StringVar(&cpuProf, "cpuprofile", "", "write a pprof CPU profile of the command to this file")
	root.PersistentFlags().StringVar(&memProf, "memprofile", "", "write a pprof heap profile to this file when the command ends")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if cpuProf == "" {
			return nil
		}
		f, err := os.Create(cpuProf)
		if err != nil {
			return err
		}
		cpuFile = f
		return pprof.StartCPUProfile(f)
	}
	root.PersistentPostRunE = func(cmd *cobra.Command, args []string) error {
		if cpuFile != nil {
			pprof.StopCPUProfile()
			if err := cpuFile.Close(); err != nil {
				return err
			}
		}
		if memProf != "" {
			f, err := os.Create(memProf)
			if err != nil {
				return err
			}
			runtime.GC()
			if err := pprof.WriteHeapProfile(f); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}
		return nil
	}
	root.AddCommand(newGenerateCmd(), newServeCmd(), newBenchCmd(), newKernelsCmd())
	return root
}

// common are the flags every subcommand shares.
type common struct {
	dir        string
	cacheBytes int64
	maxBatch   int
}

func (c *common) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&c.dir, "model", ".", "model directory: config.json and safetensors (none: seeded random weights)")
	cmd.Flags().Int64Var(&c.cacheBytes, "cache-bytes", 64<<20, "KV cache pool size in bytes")
	cmd.Flags().IntVar(&c.maxBatch, "max-batch-tokens", 2048, "per-step token budget")
}

// start loads the model, builds its engine and runs the engine loop until stop is called.
func (c *common) start() (*engine.Engine, func(), error) {
	r, pool, err := model.Open(c.dir, c.cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	e, err := engine.New(r, engine.Config{Pool: pool, MaxBatchTokens: c.maxBatch})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.Run(ctx) }()
	return e, func() { cancel(); wg.Wait(); e.Close() }, nil
}

func loadTokenizer(dir, path string) (*tokenizer.Tokenizer, error) {
	if path == "" {
		path = filepath.Join(dir, "tokenizer.json")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	return tokenizer.Load(path)
}

func parseIDs(s string) ([]int32, error) {
	var ids []int32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--prompt-ids: %q is not a token id", f)
		}
		ids = append(ids, int32(n))
	}
	if len(ids) == 0 {
		return nil, errors.New("--prompt-ids: no token ids")
	}
	return ids, nil
}

func newGenerateCmd() *cobra.Command {
	var c common
	var prompt, ids, tokPath string
	var maxTokens int
	var temp float32
	var seed uint64
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Generate tokens for one prompt and print them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := loadTokenizer(c.dir, tokPath)
			if err != nil {
				return err
			}
			var in []int32
			switch {
			case ids != "":
				if in, err = parseIDs(ids); err != nil {
					return err
				}
			case prompt != "" && tok != nil:
				if in, err = tok.Encode(prompt, true); err != nil {
					return err
				}
			case prompt != "":
				return errors.New("--prompt needs a tokenizer.json in --model or --tokenizer; use --prompt-ids with random weights")
			default:
				in = []int32{1, 2, 3, 4}
			}
			e, stop, err := c.start()
			if err != nil {
				return err
			}
			defer stop()
			t0 := time.Now()
			s, err := e.Submit(context.Background(), engine.Request{Prompt: in, Sampling: engine.SamplingParams{
				Temperature: temp, Seed: seed, HasSeed: true, MaxTokens: maxTokens, IgnoreEOS: tok == nil,
			}})
			if err != nil {
				return err
			}
			out, ev, err := s.Collect(context.Background())
			if err != nil {
				return err
			}
			if ev.Err != nil {
				return ev.Err
			}
			el := time.Since(t0)
			fmt.Printf("prompt: %v\n", in)
			fmt.Printf("tokens: %v\n", out)
			if tok != nil {
				fmt.Printf("text:   %q\n", tok.Decode(out, true))
			}
			fmt.Printf("finish: %s, %d prompt + %d generated tokens in %v (%.1f tokens/s)\n",
				ev.Finish, ev.Usage.PromptTokens, ev.Usage.CompletionTokens, el.Round(time.Millisecond),
				float64(len(out))/el.Seconds())
			return nil
		},
	}
	c.register(cmd)
	cmd.Flags().StringVar(&prompt, "prompt", "", "prompt text (needs a tokenizer)")
	cmd.Flags().StringVar(&ids, "prompt-ids", "", "prompt as comma-separated token ids")
	cmd.Flags().StringVar(&tokPath, "tokenizer", "", "tokenizer.json (default: the one in --model, if any)")
	cmd.Flags().IntVar(&maxTokens, "max-tokens", 16, "tokens to generate")
	cmd.Flags().Float32Var(&temp, "temperature", 0, "sampling temperature (0 = greedy)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "sampling seed")
	return cmd
}

func newServeCmd() *cobra.Command {
	var c common
	var addr, tokPath, chatPath, apiKey string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the model over an OpenAI-compatible HTTP API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := loadTokenizer(c.dir, tokPath)
			if err != nil {
				return err
			}
			if tok == nil {
				return fmt.Errorf("serve needs a tokenizer: put tokenizer.json in %s or pass --tokenizer", c.dir)
			}
			var chat *tokenizer.ChatTemplate
			if chatPath == "" {
				if p := filepath.Join(c.dir, "tokenizer_config.json"); fileExists(p) {
					chatPath = p
				}
			}
			if chatPath != "" {
				if chat, err = tokenizer.LoadChatTemplate(chatPath); err != nil {
					return err
				}
			}
			e, stop, err := c.start()
			if err != nil {
				return err
			}
			defer stop()
			srv, err := serve.New(serve.Config{Engine: e, Tokenizer: tok, ChatTemplate: chat, Model: model.Name, APIKey: apiKey})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			fmt.Printf("serving %s on http://%s/v1\n", model.Name, ln.Addr())
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
			defer cancel()
			return srv.Serve(ctx, ln)
		},
	}
	c.register(cmd)
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8000", "listen address")
	cmd.Flags().StringVar(&tokPath, "tokenizer", "", "tokenizer.json (default: the one in --model)")
	cmd.Flags().StringVar(&chatPath, "chat-template", "", "tokenizer_config.json holding the chat template")
	cmd.Flags().StringVar(&apiKey, "api-key", "", "require this bearer token")
	return cmd
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func newBenchCmd() *cobra.Command {
	var c common
	var requests, promptLen, genLen, concurrency int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure prefill and decode throughput through the engine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if requests <= 0 || promptLen <= 0 || genLen <= 0 || concurrency <= 0 {
				return errors.New("bench: --requests, --prompt-len, --gen-len and --concurrency must be positive")
			}
			e, stop, err := c.start()
			if err != nil {
				return err
			}
			defer stop()
			vocab := e.Info().VocabSize
			t0 := time.Now()
			var mu sync.Mutex
			var firstErr error
			var ttft time.Duration
			generated := 0
			sem := make(chan struct{}, concurrency)
			var wg sync.WaitGroup
			for i := 0; i < requests; i++ {
				prompt := make([]int32, promptLen)
				for j := range prompt {
					prompt[j] = int32((i*7919 + j*31 + 1) % vocab)
				}
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					start := time.Now()
					s, err := e.Submit(context.Background(), engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: genLen, IgnoreEOS: true}})
					if err == nil {
						var ev engine.Event
						if ev, err = s.Recv(context.Background()); err == nil {
							first := time.Since(start)
							n := len(ev.Tokens)
							if ev.Finish == engine.FinishNone {
								var rest []int32
								rest, ev, err = s.Collect(context.Background())
								n += len(rest)
							}
							mu.Lock()
							ttft += first
							generated += n
							mu.Unlock()
						}
					}
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if firstErr != nil {
				return firstErr
			}
			el := time.Since(t0)
			fmt.Printf("bench %s: %d requests × (%d prompt + %d generated) tokens, concurrency %d\n", model.Name, requests, promptLen, genLen, concurrency)
			fmt.Printf("  wall %.3fs  output %.1f tokens/s  total %.1f tokens/s  mean TTFT %.1f ms\n",
				el.Seconds(), float64(generated)/el.Seconds(), float64(generated+requests*promptLen)/el.Seconds(),
				float64(ttft.Microseconds())/1000/float64(requests))
			return nil
		},
	}
	c.register(cmd)
	cmd.Flags().IntVar(&requests, "requests", 16, "requests to run")
	cmd.Flags().IntVar(&promptLen, "prompt-len", 64, "prompt tokens per request")
	cmd.Flags().IntVar(&genLen, "gen-len", 32, "generated tokens per request")
	cmd.Flags().IntVar(&concurrency, "concurrency", 8, "requests in flight")
	return cmd
}

func newKernelsCmd() *cobra.Command {
	var arch string
	cmd := &cobra.Command{
		Use:   "kernels",
		Short: "Compile the model's own CUDA kernels with NVRTC through the shared kernel cache",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if arch == "" {
				arch = "sm_90a"
				if devs, err := cudart.Devices(); err == nil && len(devs) > 0 {
					arch = devs[0].Arch()
				}
			}
			dir, err := cudart.DefaultKernelCacheDir()
			if err != nil {
				return err
			}
			cache, err := cudart.OpenKernelCache(dir)
			if err != nil {
				return err
			}
			files, err := fs.Glob(kernels.Sources, "*.cu")
			if err != nil {
				return err
			}
			for _, f := range files {
				src, err := kernels.Source(f)
				if err != nil {
					return err
				}
				img, err := cudart.CompileCached(cache, src, f, arch, kernels.Options...)
				if err != nil {
					return fmt.Errorf("%s: %w", f, err)
				}
				fmt.Printf("%-24s %s  %7d bytes  (cache %s)\n", f, arch, len(img), dir)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&arch, "arch", "", "target architecture (default: GPU 0's, else sm_90a)")
	return cmd
}
