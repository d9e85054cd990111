package loadgen

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Stat summarizes one latency in milliseconds.
type Stat struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
}

// Report is the outcome of a run.
type Report struct {
	Endpoint    string  `json:"endpoint"`
	Concurrency int     `json:"concurrency"`
	RequestRate float64 `json:"request_rate"`
	// Seed generated the prompts and arrivals; SeedDrawn says it was drawn for this run
	// (no seed given). Config.Seed = Seed repeats the run's prompts.
	Seed      int64 `json:"seed"`
	SeedDrawn bool  `json:"seed_drawn"`
	// Requests were asked for; each completed, failed, was cancelled in flight by an
	// interruption, or was not sent because of one.
	Requests    int      `json:"requests"`
	Completed   int      `json:"completed"`
	Failed      int      `json:"failed"`
	Cancelled   int      `json:"cancelled"`
	NotSent     int      `json:"not_sent"`
	Interrupted bool     `json:"interrupted"`
	Errors      []string `json:"errors,omitempty"`
	DurationS   float64  `json:"duration_s"`
	// PromptLen is the prompt length asked for, PromptCountedBy how it was counted
	// (CountedByServer, CountedByTokenizer or CountedByWords) and PromptBuiltTokens the
	// mean length the prompts were built to by that count.
	PromptLen         int     `json:"prompt_len"`
	PromptCountedBy   string  `json:"prompt_counted_by"`
	PromptBuiltTokens float64 `json:"prompt_built_tokens_mean"`
	// PromptTokens and OutputTokens are the completed requests' usage; MeanPromptTokens
	// is the mean prompt length the server measured.
	PromptTokens     int     `json:"prompt_tokens"`
	OutputTokens     int     `json:"output_tokens"`
	MeanPromptTokens float64 `json:"mean_prompt_tokens"`
	// CachedTokens are the prompt tokens served from the prefix cache (usage
	// prompt_tokens_details.cached_tokens), CachedReported how many completed requests
	// reported them, and CachedShare CachedTokens/PromptTokens, null when none did.
	CachedTokens     int      `json:"cached_tokens"`
	CachedReported   int      `json:"cached_reported"`
	CachedShare      *float64 `json:"cached_share"`
	RequestsPerS     float64  `json:"requests_per_s"`
	OutputTokensPerS float64  `json:"output_tokens_per_s"`
	TotalTokensPerS  float64  `json:"total_tokens_per_s"`
	TTFT             Stat     `json:"ttft"`
	TPOT             Stat     `json:"tpot"`
	ITL              Stat     `json:"itl"`
	E2E              Stat     `json:"e2e_latency"`
	Warnings         []string `json:"warnings,omitempty"`
}

func summarize(cfg *Config, samples []sample, elapsed time.Duration) Report {
	r := Report{
		Endpoint:    "/v1/completions",
		Concurrency: cfg.Concurrency,
		RequestRate: cfg.RequestRate,
		Requests:    cfg.Requests,
		PromptLen:   cfg.PromptLen,
		DurationS:   elapsed.Seconds(),
	}
	if cfg.Chat {
		r.Endpoint = "/v1/chat/completions"
	}
	var ttft, tpot, itl, e2e []float64
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for _, s := range samples {
		if s.cancelled {
			r.Cancelled++
			continue
		}
		if s.err != nil {
			r.Failed++
			if len(r.Errors) < 5 {
				r.Errors = append(r.Errors, s.err.Error())
			}
			continue
		}
		r.Completed++
		r.PromptTokens += s.promptTokens
		r.OutputTokens += s.outputTokens
		r.CachedTokens += s.cachedTokens
		if s.hasCached {
			r.CachedReported++
		}
		ttft = append(ttft, ms(s.ttft))
		e2e = append(e2e, ms(s.e2e))
		if s.outputTokens > 1 {
			tpot = append(tpot, ms(s.e2e-s.ttft)/float64(s.outputTokens-1))
		}
		for _, d := range s.itl {
			itl = append(itl, ms(d))
		}
	}
	if r.Completed > 0 {
		r.MeanPromptTokens = float64(r.PromptTokens) / float64(r.Completed)
	}
	if r.CachedReported > 0 && r.PromptTokens > 0 {
		share := float64(r.CachedTokens) / float64(r.PromptTokens)
		r.CachedShare = &share
	}
	if secs := elapsed.Seconds(); secs > 0 {
		r.RequestsPerS = float64(r.Completed) / secs
		r.OutputTokensPerS = float64(r.OutputTokens) / secs
		r.TotalTokensPerS = float64(r.PromptTokens+r.OutputTokens) / secs
	}
	r.TTFT, r.TPOT, r.ITL, r.E2E = stat(ttft), stat(tpot), stat(itl), stat(e2e)
	return r
}

func stat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Stat{Mean: sum / float64(len(xs)), P50: percentile(xs, 0.5), P90: percentile(xs, 0.9), P99: percentile(xs, 0.99)}
}

// WriteTable prints the report for people.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	mode := fmt.Sprintf("concurrency %d", r.Concurrency)
	if r.RequestRate > 0 {
		mode = fmt.Sprintf("Poisson %.2f req/s, concurrency cap %d", r.RequestRate, r.Concurrency)
	}
	fmt.Fprintf(tw, "endpoint\t%s (%s)\n", r.Endpoint, mode)
	if r.SeedDrawn {
		fmt.Fprintf(tw, "seed\t%d (drawn for this run; --seed %d repeats its prompts)\n", r.Seed, r.Seed)
	} else {
		fmt.Fprintf(tw, "seed\t%d\n", r.Seed)
	}
	fmt.Fprintf(tw, "requests\t%s\n", r.requestsLine())
	fmt.Fprintf(tw, "duration\t%.2f s\n", r.DurationS)
	fmt.Fprintf(tw, "prompts\t%d tokens asked, counted by %s (built %.1f); %.1f tokens mean in usage\n",
		r.PromptLen, r.PromptCountedBy, r.PromptBuiltTokens, r.MeanPromptTokens)
	fmt.Fprintf(tw, "tokens\t%d prompt, %d output\n", r.PromptTokens, r.OutputTokens)
	fmt.Fprintf(tw, "cached\t%s\n", r.cachedLine())
	fmt.Fprintf(tw, "throughput\t%.2f req/s, %.1f output tok/s, %.1f total tok/s\n", r.RequestsPerS, r.OutputTokensPerS, r.TotalTokensPerS)
	fmt.Fprintf(tw, "\nlatency (ms)\tmean\tp50\tp90\tp99\n")
	for _, row := range []struct {
		name string
		s    Stat
	}{{"TTFT", r.TTFT}, {"TPOT", r.TPOT}, {"ITL", r.ITL}, {"E2E", r.E2E}} {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\n", row.name, row.s.Mean, row.s.P50, row.s.P90, row.s.P99)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(tw, "error\t%s\n", e)
	}
	for _, m := range r.Warnings {
		fmt.Fprintf(tw, "warning\t%s\n", m)
	}
	return tw.Flush()
}

func (r *Report) requestsLine() string {
	parts := []string{fmt.Sprintf("%d completed", r.Completed), fmt.Sprintf("%d failed", r.Failed)}
	if r.Cancelled > 0 || r.Interrupted {
		parts = append(parts, fmt.Sprintf("%d cancelled", r.Cancelled))
	}
	if r.NotSent > 0 || r.Interrupted {
		parts = append(parts, fmt.Sprintf("%d not sent", r.NotSent))
	}
	line := fmt.Sprintf("%s of %d", strings.Join(parts, ", "), r.Requests)
	if r.Interrupted {
		line += " (interrupted)"
	}
	return line
}

func (r *Report) cachedLine() string {
	if r.CachedShare == nil {
		return "n/a (no usage carried prompt_tokens_details.cached_tokens: the server does not report it, or omits it when nothing was cached)"
	}
	line := fmt.Sprintf("%d of %d prompt tokens (%.1f%%)", r.CachedTokens, r.PromptTokens, 100**r.CachedShare)
	if r.CachedReported < r.Completed {
		line += fmt.Sprintf(", reported by %d of %d responses", r.CachedReported, r.Completed)
	}
	return line
}
