package cli

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
)

// BenchCmd is `bench`: synthetic requests through the engine, with the output and total
// throughput and the mean time to first token printed. With --batch-sizes it measures the
// two phases apart instead: for each batch size B, B prompts submitted at once, prefill
// tokens/s up to every request's first token and decode tokens/s after it (see runPhases).
func BenchCmd(l Loader) *cobra.Command {
	var ef EngineFlags
	var requests, promptLen, genLen, concurrency, repeat int
	var batches []int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure prefill and decode throughput through the engine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, f := range []struct {
				name string
				v    int
			}{{"requests", requests}, {"prompt-len", promptLen}, {"gen-len", genLen}, {"concurrency", concurrency}} {
				if f.v <= 0 {
					return fmt.Errorf("bench: --%s %d must be positive", f.name, f.v)
				}
			}
			if err := checkPhaseFlags(batches, genLen, repeat); err != nil {
				return err
			}
			// Every request of a batch (or in flight) may wait in the queue at once.
			atOnce := batches
			if len(batches) == 0 {
				atOnce = []int{concurrency}
			}
			for _, b := range atOnce {
				if ef.MaxQueue > 0 && b > ef.MaxQueue {
					return fmt.Errorf("bench: %d requests at once is more than --max-queue %d lets wait; raise --max-queue (0 = no cap)", b, ef.MaxQueue)
				}
			}
			rt, cfg, err := load(cmd, l, &ef)
			if err != nil {
				return err
			}
			e, err := Start(rt, cfg)
			if err != nil {
				return err
			}
			if len(batches) > 0 {
				err = printPhases(cmd, e, rt.RunnerName, batches, promptLen, genLen, repeat)
				return errors.Join(err, e.Stop())
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
			writeSpecStats(out, e.Engine)
			return nil
		},
	}
	l.Register(cmd)
	ef.Register(cmd)
	cmd.Flags().IntVar(&requests, "requests", 16, "requests to run")
	cmd.Flags().IntVar(&promptLen, "prompt-len", 64, "prompt tokens per request")
	cmd.Flags().IntVar(&genLen, "gen-len", 32, "generated tokens per request")
	cmd.Flags().IntVar(&concurrency, "concurrency", 8, "requests in flight")
	cmd.Flags().IntSliceVar(&batches, "batch-sizes", nil, "measure prefill and decode tokens/s apart at these batch sizes (e.g. 1,8): B prompts at once, instead of --requests and --concurrency")
	cmd.Flags().IntVar(&repeat, "repeat", 3, "with --batch-sizes: runs per batch size; the median is printed")
	return cmd
}

func checkPhaseFlags(batches []int, genLen, repeat int) error {
	if len(batches) == 0 {
		return nil
	}
	for _, b := range batches {
		if b <= 0 {
			return fmt.Errorf("bench: --batch-sizes %d must be positive", b)
		}
	}
	if repeat <= 0 {
		return fmt.Errorf("bench: --repeat %d must be positive", repeat)
	}
	if genLen < 2 {
		return fmt.Errorf("bench: --gen-len %d leaves no decode step to measure with --batch-sizes (want 2 or more)", genLen)
	}
	return nil
}

// printPhases runs runPhases repeat times per batch size and prints the medians.
func printPhases(cmd *cobra.Command, e *Engine, name string, batches []int, promptLen, genLen, repeat int) error {
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "bench %s: prefill and decode apart, %d prompt + %d generated tokens per sequence, median of %d, GOMAXPROCS %d\n",
		name, promptLen, genLen, repeat, runtime.GOMAXPROCS(0))
	salt := 0
	for _, b := range batches {
		pre, dec := make([]float64, repeat), make([]float64, repeat)
		for r := range repeat {
			ph, err := runPhases(cmd.Context(), e, b, promptLen, genLen, salt)
			if err != nil {
				return fmt.Errorf("bench: batch %d: %w", b, err)
			}
			salt += b
			pre[r], dec[r] = ph.prefillRate(), ph.decodeRate()
		}
		fmt.Fprintf(out, "  batch %d  prefill %.1f tokens/s  decode %.1f tokens/s\n", b, median(pre), median(dec))
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// phases is one runPhases measurement.
type phases struct {
	prompt  int           // prompt tokens of the batch
	prefill time.Duration // from submitting to the last request's first token
	decoded int           // tokens that arrived after that
	decode  time.Duration // from then to the last token
}

func (p phases) prefillRate() float64 { return float64(p.prompt) / p.prefill.Seconds() }
func (p phases) decodeRate() float64  { return float64(p.decoded) / p.decode.Seconds() }

// runPhases submits batch prompts of promptLen tokens at once (distinct from every other
// run's, through salt, so no prefix is cached) and lets each generate genLen tokens. The
// prefill phase ends when every request has its first token; the decode phase counts the
// tokens that arrive after that, until the last one.
func runPhases(ctx context.Context, e *Engine, batch, promptLen, genLen, salt int) (phases, error) {
	vocab := e.Info().VocabSize
	type arrival struct {
		at time.Time
		n  int
	}
	got := make([][]arrival, batch)
	streams := make([]*engine.Stream, batch)
	t0 := time.Now()
	for i := range batch {
		prompt := make([]int32, promptLen)
		for j := range prompt {
			prompt[j] = int32(((salt+i)*7919 + j*31 + 1) % vocab)
		}
		s, err := e.Submit(ctx, engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: genLen, IgnoreEOS: true}})
		if err != nil {
			return phases{}, err
		}
		streams[i] = s
	}
	errs := make([]error, batch)
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Go(func() {
			for {
				ev, err := s.Recv(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				if len(ev.Tokens) > 0 {
					got[i] = append(got[i], arrival{time.Now(), len(ev.Tokens)})
				}
				if ev.Finish != engine.FinishNone {
					errs[i] = ev.Err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return phases{}, err
	}
	var first, last time.Time
	for i, a := range got {
		if len(a) == 0 {
			return phases{}, fmt.Errorf("request %d generated nothing", i)
		}
		if a[0].at.After(first) {
			first = a[0].at
		}
		if end := a[len(a)-1].at; end.After(last) {
			last = end
		}
	}
	p := phases{prompt: batch * promptLen, prefill: first.Sub(t0), decode: last.Sub(first)}
	for _, a := range got {
		for _, x := range a {
			if x.at.After(first) {
				p.decoded += x.n
			}
		}
	}
	if p.decoded == 0 || p.decode <= 0 {
		return p, errors.New("no token arrived after the prefill phase (is --max-batch-tokens below the batch's prompt tokens?)")
	}
	return p, nil
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
