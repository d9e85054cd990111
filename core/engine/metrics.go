package engine

import (
	"cmp"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's counters and histograms. They are plain numbers changed only
// by the scheduler's owner (under the engine's lock), so recording costs no atomics; the
// collector reads them under the same lock at scrape time.
type metrics struct {
	promptTokens, generationTokens uint64
	prefixQueries, prefixHits      uint64 // tokens offered to / served by the prefix cache
	preemptions                    uint64
	draftsProposed, draftsAccepted uint64
	// Per verification of at least one draft (vLLM's spec_decode_num_drafts), and per
	// draft slot j of a block: drafts verified there and accepted there.
	verifications        uint64
	draftsAt, acceptedAt []uint64
	runnerErrors         uint64
	finished             [FinishError + 1]uint64

	ttft, itl, e2e    hist
	schedule, execute hist
	stepTokens        hist // tokens per step (vLLM's iteration_tokens_total)
	maxTokens         hist // per finished request: its max tokens (vLLM's request_params_max_tokens)
	// Per finished request: its phases (vLLM's request_*_time_seconds) and lengths.
	queue, prefill, decode, inference hist
	promptLen, generationLen          hist
}

var (
	// latencyBuckets reach an hour: long generations and queues under overload take
	// minutes.
	latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
		160, 320, 640, 1280, 2400, 3600}
	// tokenBuckets are 1-2-5 steps up to a million tokens, as vLLM's request length
	// histograms.
	tokenBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
		100000, 200000, 500000, 1000000}
	// iterationBuckets are vLLM's for tokens per step.
	iterationBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	stepBuckets      = []float64{1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}
)

func newMetrics() *metrics {
	return &metrics{
		ttft: newHist(latencyBuckets), itl: newHist(latencyBuckets), e2e: newHist(latencyBuckets),
		schedule: newHist(stepBuckets), execute: newHist(stepBuckets),
		stepTokens: newHist(iterationBuckets), maxTokens: newHist(tokenBuckets),
		queue: newHist(latencyBuckets), prefill: newHist(latencyBuckets), decode: newHist(latencyBuckets),
		inference: newHist(latencyBuckets), promptLen: newHist(tokenBuckets), generationLen: newHist(tokenBuckets),
	}
}

// observeFinish records a request as it finishes at now: its end-to-end latency and
// lengths, and once it was scheduled its phases: queue (arrival to first scheduled),
// prefill (to the first token), decode (first to last token) and inference (first
// scheduled to the finish). A request preempted and resumed keeps its first times.
func (m *metrics) observeFinish(r *request, now, epoch time.Time) {
	m.e2e.observe(now.Sub(r.arrival).Seconds())
	m.promptLen.observe(float64(r.promptLen))
	m.generationLen.observe(float64(len(r.tokens) - r.promptLen))
	m.maxTokens.observe(float64(r.end - r.promptLen))
	if !r.admitted {
		return
	}
	at := func(ns int64) time.Time { return epoch.Add(time.Duration(ns)) }
	scheduled := at(r.scheduledNs)
	m.queue.observe(scheduled.Sub(r.arrival).Seconds())
	m.inference.observe(now.Sub(scheduled).Seconds())
	if len(r.tokens) > r.promptLen {
		m.prefill.observe(float64(r.firstTokenNs-r.scheduledNs) * 1e-9)
		m.decode.observe(float64(r.lastToken-r.firstTokenNs) * 1e-9)
	}
}

// observeDrafts records one verification of k drafts of which the first accepted were
// accepted: the totals and the counts per draft slot.
func (m *metrics) observeDrafts(k, accepted int) {
	m.draftsProposed += uint64(k)
	m.draftsAccepted += uint64(accepted)
	m.verifications++
	for len(m.draftsAt) < k {
		m.draftsAt, m.acceptedAt = append(m.draftsAt, 0), append(m.acceptedAt, 0)
	}
	for j := range k {
		m.draftsAt[j]++
		if j < accepted {
			m.acceptedAt[j]++
		}
	}
}

// SpecCounters are a scheduler's speculative-decoding totals per draft slot.
type SpecCounters struct {
	// Verifications counts the verifications of at least one draft (one sequence's step).
	Verifications uint64
	// DraftsAt[j] and AcceptedAt[j]: drafts verified in slot j of a block (the j+1-th
	// draft after the anchor) and how many of them were accepted.
	DraftsAt, AcceptedAt []uint64
}

// AcceptanceRate is AcceptedAt[j]/DraftsAt[j] (0 for a slot never verified).
func (c SpecCounters) AcceptanceRate(j int) float64 {
	if j >= len(c.DraftsAt) || c.DraftsAt[j] == 0 {
		return 0
	}
	return float64(c.AcceptedAt[j]) / float64(c.DraftsAt[j])
}

// MeanAcceptedLength is the mean number of drafts accepted per verification.
func (c SpecCounters) MeanAcceptedLength() float64 {
	if c.Verifications == 0 {
		return 0
	}
	var a uint64
	for _, n := range c.AcceptedAt {
		a += n
	}
	return float64(a) / float64(c.Verifications)
}

// SpecCounters returns the scheduler's speculative-decoding totals per draft slot.
func (s *Scheduler) SpecCounters() SpecCounters {
	m := s.metrics
	return SpecCounters{Verifications: m.verifications, DraftsAt: slices.Clone(m.draftsAt), AcceptedAt: slices.Clone(m.acceptedAt)}
}

// sinceEpoch is the scheduler's clock in nanoseconds since its epoch, as request
// timestamps are kept.
func (s *Scheduler) sinceEpoch() int64 { return s.now().Sub(s.epoch).Nanoseconds() }

// observeStep records a step's engine and runner times and the tokens it scheduled.
func (m *metrics) observeStep(schedule, execute time.Duration, tokens int) {
	m.schedule.observe(schedule.Seconds())
	m.execute.observe(execute.Seconds())
	m.stepTokens.observe(float64(tokens))
}

// hist is a cumulative-on-read histogram with fixed upper bounds.
type hist struct {
	bounds []float64
	counts []uint64 // per bucket (not cumulative), plus +Inf at the end
	sum    float64
	n      uint64
	last   float64 // memo: consecutive equal observations skip the search
	lastB  int
}

func newHist(bounds []float64) hist {
	return hist{bounds: bounds, counts: make([]uint64, len(bounds)+1), last: -1}
}

func (h *hist) observe(v float64) { h.observeN(v, 1) }

// observeN records n observations of v.
func (h *hist) observeN(v float64, n uint64) {
	b := h.lastB
	if v != h.last {
		b = sort.SearchFloat64s(h.bounds, v)
		h.last, h.lastB = v, b
	}
	h.counts[b] += n
	h.sum += v * float64(n)
	h.n += n
}

func (h *hist) metric(d *prometheus.Desc) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.bounds))
	var acc uint64
	for i, ub := range h.bounds {
		acc += h.counts[i]
		buckets[ub] = acc
	}
	return prometheus.MustNewConstHistogram(d, h.n, h.sum, buckets)
}

// gaugeSource is what the collector reads besides metrics: queue lengths and cache use.
type gaugeSource interface {
	queueLens() (running, waiting int)
	cacheUsage(fn func(group string, ratio float64))
}

// collector exposes metrics to Prometheus, reading them under the engine's lock.
type collector struct {
	m   *metrics
	mu  sync.Locker
	src gaugeSource

	running, waiting, cache                    *prometheus.Desc
	prompt, generation, queries, hits, preempt *prometheus.Desc
	drafts, accepted, runnerErrors, finished   *prometheus.Desc
	verifications, draftsAt, acceptedAt        *prometheus.Desc
	ttft, itl, e2e, schedule, execute          *prometheus.Desc
	queue, prefill, decode, inference          *prometheus.Desc
	promptLen, generationLen                   *prometheus.Desc
	vllm                                       vllmDescs
}

// vllmDescs are the same quantities under the names, types and labels vLLM's Prometheus
// logger gives them (vllm/v1/metrics/loggers.py: a "vllm:" prefix, an engine label, and
// model_name, which the server adds to every metric), so that dashboards made for vLLM
// read Resin's /metrics. The histograms keep Resin's buckets.
type vllmDescs struct {
	running, waiting, cache, gpuCache, queries, hits *prometheus.Desc
	preempt, maxGeneration                           *prometheus.Desc
	prompt, generation, success, drafts, accepted    *prometheus.Desc
	verifications, acceptedAt                        *prometheus.Desc
	promptLen, generationLen, iteration, maxTokens   *prometheus.Desc
	ttft, tpot, itl, e2e, queue, inference, prefill  *prometheus.Desc
	decode                                           *prometheus.Desc
}

func newVLLMDescs(engine string) vllmDescs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("vllm:"+name, help, labels, prometheus.Labels{"engine": cmp.Or(engine, "0")})
	}
	return vllmDescs{
		running: d("num_requests_running", "Number of requests in model execution batches."),
		waiting: d("num_requests_waiting", "Number of requests waiting to be processed."),
		cache:   d("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		// vLLM's former name for it, which its example dashboard still reads.
		gpuCache:      d("gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead."),
		queries:       d("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:          d("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preempt:       d("num_preemptions_total", "Cumulative number of preemption from the engine."),
		prompt:        d("prompt_tokens_total", "Number of prefill tokens processed."),
		generation:    d("generation_tokens_total", "Number of generation tokens processed."),
		success:       d("request_success_total", "Count of successfully processed requests.", "finished_reason"),
		drafts:        d("spec_decode_num_draft_tokens_total", "Number of draft tokens."),
		accepted:      d("spec_decode_num_accepted_tokens_total", "Number of accepted tokens."),
		verifications: d("spec_decode_num_drafts_total", "Number of spec decoding drafts."),
		acceptedAt:    d("spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft's position in speculative sequences.", "position"),
		promptLen:     d("request_prompt_tokens", "Number of prefill tokens processed."),
		generationLen: d("request_generation_tokens", "Number of generation tokens processed."),
		// The most tokens a choice of the request generated; each choice is an engine
		// request of its own, so per engine request, its generated tokens.
		maxGeneration: d("request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."),
		iteration:     d("iteration_tokens_total", "Histogram of number of tokens per engine_step."),
		maxTokens:     d("request_params_max_tokens", "Histogram of the max_tokens request parameter."),
		ttft:          d("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
		tpot:          d("time_per_output_token_seconds", "Histogram of time per output token in seconds."),
		itl:           d("inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
		e2e:           d("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
		queue:         d("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
		inference:     d("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
		prefill:       d("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
		decode:        d("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
	}
}

func (v *vllmDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{v.running, v.waiting, v.cache, v.gpuCache, v.maxGeneration, v.queries, v.hits, v.preempt, v.prompt, v.generation,
		v.success, v.drafts, v.accepted, v.verifications, v.acceptedAt, v.promptLen, v.generationLen, v.iteration, v.maxTokens, v.ttft, v.tpot, v.itl,
		v.e2e, v.queue, v.inference, v.prefill, v.decode}
}

// newCollector is the engine's metrics; engine, when set, labels Resin's too
// (Config.EngineLabel).
func newCollector(m *metrics, mu sync.Locker, src gaugeSource, engine string) *collector {
	var constLabels prometheus.Labels
	if engine != "" {
		constLabels = prometheus.Labels{"engine": engine}
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("resin_"+name, help, labels, constLabels)
	}
	return &collector{
		m: m, mu: mu, src: src,
		running:       d("requests_running", "Requests scheduled in the running set."),
		waiting:       d("requests_waiting", "Requests waiting for admission."),
		cache:         d("kv_cache_usage_ratio", "Fraction of the cache pool's pages a group uses.", "group"),
		prompt:        d("prompt_tokens_total", "Prompt tokens of admitted requests."),
		generation:    d("generation_tokens_total", "Generated tokens."),
		queries:       d("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."),
		hits:          d("prefix_cache_hits_total", "Prompt tokens served by the prefix cache."),
		preempt:       d("preemptions_total", "Requests preempted by recompute."),
		drafts:        d("spec_decode_draft_tokens_total", "Draft tokens scheduled for verification."),
		accepted:      d("spec_decode_accepted_tokens_total", "Draft tokens the runner accepted."),
		verifications: d("spec_decode_num_drafts_total", "Verifications of at least one draft token (one sequence's step)."),
		draftsAt:      d("spec_decode_draft_tokens_per_pos_total", "Draft tokens verified per position in the block (0: the first draft after the anchor).", "position"),
		acceptedAt:    d("spec_decode_accepted_tokens_per_pos_total", "Draft tokens accepted per position in the block (0: the first draft after the anchor).", "position"),
		runnerErrors:  d("runner_errors_total", "Steps the runner failed."),
		finished:      d("requests_finished_total", "Finished requests by finish reason.", "reason"),
		ttft:          d("time_to_first_token_seconds", "Time from arrival to the first token."),
		itl:           d("inter_token_latency_seconds", "Time between consecutive tokens of a request."),
		e2e:           d("e2e_request_latency_seconds", "Time from arrival to the terminal event."),
		schedule:      d("step_schedule_seconds", "Engine time per step: scheduling, plan building and applying the result."),
		execute:       d("step_execute_seconds", "Runner time per step."),
		queue:         d("request_queue_time_seconds", "Time a finished request waited from arrival until first scheduled."),
		prefill:       d("request_prefill_time_seconds", "Time from first scheduled to the first token, per finished request."),
		decode:        d("request_decode_time_seconds", "Time from the first to the last token, per finished request."),
		inference:     d("request_inference_time_seconds", "Time from first scheduled to the finish, per finished request."),
		promptLen:     d("request_prompt_tokens", "Prompt tokens per finished request."),
		generationLen: d("request_generation_tokens", "Generated tokens per finished request."),
		vllm:          newVLLMDescs(engine),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.cache, c.prompt, c.generation, c.queries, c.hits,
		c.preempt, c.drafts, c.accepted, c.verifications, c.draftsAt, c.acceptedAt, c.runnerErrors, c.finished, c.ttft, c.itl, c.e2e, c.schedule, c.execute,
		c.queue, c.prefill, c.decode, c.inference, c.promptLen, c.generationLen} {
		ch <- d
	}
	for _, d := range c.vllm.all() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.m
	run, wait := c.src.queueLens()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.running, float64(run))
	gauge(c.waiting, float64(wait))
	used := 0.0
	c.src.cacheUsage(func(group string, ratio float64) {
		gauge(c.cache, ratio, group)
		used += ratio
	})
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(c.prompt, m.promptTokens)
	counter(c.generation, m.generationTokens)
	counter(c.queries, m.prefixQueries)
	counter(c.hits, m.prefixHits)
	counter(c.preempt, m.preemptions)
	counter(c.drafts, m.draftsProposed)
	counter(c.accepted, m.draftsAccepted)
	counter(c.verifications, m.verifications)
	for j := range m.draftsAt {
		pos := strconv.Itoa(j)
		counter(c.draftsAt, m.draftsAt[j], pos)
		counter(c.acceptedAt, m.acceptedAt[j], pos)
	}
	counter(c.runnerErrors, m.runnerErrors)
	for r := FinishStop; r <= FinishError; r++ {
		counter(c.finished, m.finished[r], r.String())
	}
	ch <- m.ttft.metric(c.ttft)
	ch <- m.itl.metric(c.itl)
	ch <- m.e2e.metric(c.e2e)
	ch <- m.schedule.metric(c.schedule)
	ch <- m.execute.metric(c.execute)
	ch <- m.queue.metric(c.queue)
	ch <- m.prefill.metric(c.prefill)
	ch <- m.decode.metric(c.decode)
	ch <- m.inference.metric(c.inference)
	ch <- m.promptLen.metric(c.promptLen)
	ch <- m.generationLen.metric(c.generationLen)

	v := &c.vllm
	gauge(v.running, float64(run))
	gauge(v.waiting, float64(wait))
	gauge(v.cache, used) // the groups' shares of one arena add up to its use
	gauge(v.gpuCache, used)
	counter(v.queries, m.prefixQueries)
	counter(v.hits, m.prefixHits)
	counter(v.preempt, m.preemptions)
	counter(v.prompt, m.promptTokens)
	counter(v.generation, m.generationTokens)
	for r := FinishStop; r <= FinishError; r++ {
		counter(v.success, m.finished[r], r.String())
	}
	counter(v.drafts, m.draftsProposed)
	counter(v.accepted, m.draftsAccepted)
	counter(v.verifications, m.verifications)
	for j, n := range m.acceptedAt {
		counter(v.acceptedAt, n, strconv.Itoa(j))
	}
	ch <- m.promptLen.metric(v.promptLen)
	ch <- m.generationLen.metric(v.generationLen)
	ch <- m.generationLen.metric(v.maxGeneration)
	ch <- m.stepTokens.metric(v.iteration)
	ch <- m.maxTokens.metric(v.maxTokens)
	ch <- m.ttft.metric(v.ttft)
	ch <- m.itl.metric(v.tpot) // vLLM's time per output token: the gap before each token
	ch <- m.itl.metric(v.itl)
	ch <- m.e2e.metric(v.e2e)
	ch <- m.queue.metric(v.queue)
	ch <- m.inference.metric(v.inference)
	ch <- m.prefill.metric(v.prefill)
	ch <- m.decode.metric(v.decode)
}

// SpecCounters returns the engine's speculative-decoding totals per draft slot.
func (e *Engine) SpecCounters() SpecCounters {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.s.SpecCounters()
}
