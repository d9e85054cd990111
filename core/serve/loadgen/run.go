package loadgen

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// words build the synthetic prompts: common English words, about one token each in
// byte-level BPE vocabularies.
var words = strings.Fields(`the of and to in is was for on that with as by at from his her
it an were are which this be or has had not but first one their its new after who they two
have been also more other than into time most when would only about over some these many
city state world year part people during later made found known where like under while
between three since before however both through water small system group number house`)

// Run sends cfg.Requests requests and returns their report. It returns early with what it
// measured when ctx is done.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5e12))
	prompts := make([]string, cfg.Requests)
	for i := range prompts {
		var b strings.Builder
		for w := 0; w < cfg.PromptWords; w++ {
			if w > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[rng.IntN(len(words))])
		}
		prompts[i] = b.String()
	}
	hc := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        cfg.Concurrency,
		MaxIdleConnsPerHost: cfg.Concurrency,
		MaxConnsPerHost:     cfg.Concurrency,
	}}
	defer hc.CloseIdleConnections()

	samples := make([]sample, 0, cfg.Requests)
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, cfg.Concurrency)
	start := time.Now()
	next := start
	sent := 0
loop:
	for ; sent < cfg.Requests; sent++ {
		if cfg.RequestRate > 0 {
			next = next.Add(time.Duration(rng.ExpFloat64() / cfg.RequestRate * float64(time.Second)))
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
		wg.Add(1)
		go func(prompt string) {
			defer wg.Done()
			s := send(ctx, hc, &cfg, prompt)
			<-slots
			mu.Lock()
			samples = append(samples, s)
			if cfg.Progress != nil {
				cfg.Progress(len(samples), cfg.Requests)
			}
			mu.Unlock()
		}(prompts[sent])
	}
	wg.Wait()
	return summarize(&cfg, samples, time.Since(start)), ctx.Err()
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
