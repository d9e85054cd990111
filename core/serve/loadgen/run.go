package loadgen

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Run sends cfg.Requests requests and returns their report. When ctx is done it stops
// sending, cancels the requests in flight (counted as cancelled, not failed) and returns
// the report of what it measured with ctx's error.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	seedDrawn := cfg.Seed == 0
	if seedDrawn {
		cfg.Seed = rand.Int64N(1e9) + 1
	}
	hc := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        cfg.Concurrency,
		MaxIdleConnsPerHost: cfg.Concurrency,
		MaxConnsPerHost:     cfg.Concurrency,
	}}
	defer hc.CloseIdleConnections()

	c, countedBy, warning, err := pickCounter(ctx, hc, &cfg)
	if err != nil {
		return Report{}, err
	}
	if warning != "" && cfg.Warn != nil {
		cfg.Warn(warning)
	}
	prompts, err := buildPrompts(ctx, c, &cfg)
	if err != nil {
		return Report{}, err
	}

	start := time.Now()
	samples, sent := drive(ctx, hc, &cfg, prompts)
	r := summarize(&cfg, samples, time.Since(start))
	r.NotSent = cfg.Requests - sent
	r.Interrupted = ctx.Err() != nil
	r.Seed, r.SeedDrawn = cfg.Seed, seedDrawn
	r.PromptCountedBy = countedBy
	r.PromptBuiltTokens = meanBuilt(prompts)
	if warning != "" {
		r.Warnings = append(r.Warnings, warning)
	}
	return r, ctx.Err()
}

// drive sends the prompts at cfg's concurrency and arrival rate until they are all sent
// or ctx is done, waits for the requests in flight and returns their samples and how
// many prompts were sent.
func drive(ctx context.Context, hc *http.Client, cfg *Config, prompts []prompt) ([]sample, int) {
	samples := make([]sample, 0, len(prompts))
	tally := Tally{Total: len(prompts)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, cfg.Concurrency)
	arrivals := rand.New(rand.NewPCG(uint64(cfg.Seed), 0))
	if cfg.Progress != nil {
		cfg.Progress(tally)
	}
	next := time.Now()
	sent := 0
loop:
	for ; sent < len(prompts); sent++ {
		if cfg.RequestRate > 0 {
			next = next.Add(time.Duration(arrivals.ExpFloat64() / cfg.RequestRate * float64(time.Second)))
			if d := time.Until(next); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					break loop
				}
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		if ctx.Err() != nil { // a free slot and a cancellation at once: stop
			break
		}
		wg.Add(1)
		go func(prompt string) {
			defer wg.Done()
			s := send(ctx, hc, cfg, prompt)
			<-slots
			mu.Lock()
			defer mu.Unlock()
			samples = append(samples, s)
			switch {
			case s.cancelled:
				tally.Cancelled++
			case s.err != nil:
				tally.Failed++
			default:
				tally.Completed++
			}
			if cfg.Progress != nil {
				cfg.Progress(tally)
			}
		}(prompts[sent].text)
	}
	wg.Wait()
	return samples, sent
}

// prompt is one generated prompt and its length as the counter measured it.
type prompt struct {
	text   string
	tokens int
}

// buildPrompts makes cfg.Requests prompts of cfg.PromptLen tokens from cfg.Seed. The
// first one gives the number of words the others start from; they are built on up to
// cfg.Concurrency goroutines (counting may be a request to the server each time).
func buildPrompts(ctx context.Context, c counter, cfg *Config) ([]prompt, error) {
	prompts := make([]prompt, cfg.Requests)
	errs := make([]error, cfg.Requests)
	build := func(i, guess int) {
		p := &prompts[i]
		p.text, p.tokens, errs[i] = buildPrompt(ctx, c, promptRand(cfg.Seed, i), cfg.PromptLen, guess)
	}
	build(0, 0)
	guess := len(strings.Fields(prompts[0].text))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(cfg.Concurrency, cfg.Requests-1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				build(i, guess)
			}
		}()
	}
	for i := 1; i < len(prompts) && errs[0] == nil; i++ {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("build prompts: %w", err)
	}
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("build prompt %d: %w", i, err)
		}
	}
	return prompts, nil
}

func meanBuilt(prompts []prompt) float64 {
	sum := 0
	for _, p := range prompts {
		sum += p.tokens
	}
	return float64(sum) / float64(len(prompts))
}

// percentile returns the q-quantile (0..1) of sorted xs by linear interpolation.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}
