package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
)

// BenchCmd is `bench`: synthetic requests through the engine, with the output and total
// throughput and the mean time to first token printed.
func BenchCmd(l Loader) *cobra.Command {
	var ef EngineFlags
	var requests, promptLen, genLen, concurrency int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure prefill and decode throughput through the engine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if requests <= 0 || promptLen <= 0 || genLen <= 0 || concurrency <= 0 {
				return errors.New("bench: --requests, --prompt-len, --gen-len and --concurrency must be positive")
			}
			rt, cfg, err := load(cmd, l, &ef)
			if err != nil {
				return err
			}
			e, err := Start(rt, cfg)
			if err != nil {
				return err
			}
			res, err := runBench(cmd.Context(), e, requests, promptLen, genLen, concurrency)
			if serr := e.Stop(); err == nil {
				err = serr
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "bench %s: %d requests × (%d prompt + %d generated) tokens, concurrency %d\n", rt.RunnerName, requests, promptLen, genLen, concurrency)
			fmt.Fprintf(out, "  wall %.3fs  output %.1f tokens/s  total %.1f tokens/s  mean TTFT %.1f ms\n",
				res.wall.Seconds(), float64(res.generated)/res.wall.Seconds(), float64(res.generated+requests*promptLen)/res.wall.Seconds(),
				float64(res.ttft.Microseconds())/1000/float64(requests))
			return nil
		},
	}
	l.Register(cmd)
	ef.Register(cmd)
	cmd.Flags().IntVar(&requests, "requests", 16, "requests to run")
	cmd.Flags().IntVar(&promptLen, "prompt-len", 64, "prompt tokens per request")
	cmd.Flags().IntVar(&genLen, "gen-len", 32, "generated tokens per request")
	cmd.Flags().IntVar(&concurrency, "concurrency", 8, "requests in flight")
	return cmd
}

type benchResult struct {
	wall, ttft time.Duration // ttft summed over the requests
	generated  int
}

// runBench runs requests synthetic prompts of promptLen tokens, concurrency at a time,
// each generating genLen tokens.
func runBench(ctx context.Context, e *Engine, requests, promptLen, genLen, concurrency int) (benchResult, error) {
	vocab := e.Info().VocabSize
	var mu sync.Mutex
	var res benchResult
	var firstErr error
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < requests; i++ {
		prompt := make([]int32, promptLen)
		for j := range prompt {
			prompt[j] = int32((i*7919 + j*31 + 1) % vocab)
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			first, n, err := benchOne(ctx, e, prompt, genLen)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			res.ttft += first
			res.generated += n
		})
	}
	wg.Wait()
	res.wall = time.Since(t0)
	return res, firstErr
}

// benchOne runs one request and returns its time to first token and its token count.
func benchOne(ctx context.Context, e *Engine, prompt []int32, genLen int) (time.Duration, int, error) {
	start := time.Now()
	s, err := e.Submit(ctx, engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: genLen, IgnoreEOS: true}})
	if err != nil {
		return 0, 0, err
	}
	ev, err := s.Recv(ctx)
	if err != nil {
		return 0, 0, err
	}
	first := time.Since(start)
	n := len(ev.Tokens)
	if ev.Finish == engine.FinishNone {
		var rest []int32
		rest, ev, err = s.Collect(ctx)
		if err != nil {
			return first, n, err
		}
		n += len(rest)
	}
	if ev.Err != nil {
		return first, n, ev.Err
	}
	return first, n, nil
}
