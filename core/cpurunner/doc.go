// Package cpurunner is the engine wiring every CPU model runtime shares: given a model's
// forward pass, Runner implements engine.Runner. Each step it sizes the logits buffer,
// runs the forward over the BatchPlan, samples one token per sequence that has a logits
// row (engine.Sampler: greedy, temperature, top-k/p, min-p, seeded) and fills the
// StepResult with the tokens, their logprobs and the top alternatives asked for. It
// reuses its buffers, so a step allocates nothing in steady state. A model that proposes
// drafts (an MTP head) implements Drafter as well: Runner then verifies each plan's
// drafts against the tokens it samples and asks the model for the next ones (spec.go);
// one that samples its drafts from a distribution of its own (DSpark) implements
// DraftSampler, and its sampled rows are verified by rejection sampling.
//
// A model runner keeps what is its own (loading config and weights, binding its cache to
// the pool) and embeds a Runner built over a closure that reads its current cache, which
// is also how it says it is not bound yet:
//
//	type Runner struct {
//		*cpurunner.Runner // Info, Execute, CaptureLogits
//		Model *Model
//		kv    *KVCache // nil until Bind
//	}
//
//	func NewRunner(m *Model, pageTokens int) *Runner {
//		r := &Runner{Model: m}
//		info := engine.RunnerInfo{Name: Name, VocabSize: m.Config.VocabSize, MaxContext: m.MaxContext(),
//			EOS: m.Config.EOSTokenID, CacheGroups: CacheGroups(m.Config, pageTokens)}
//		r.Runner = cpurunner.New(info, cpurunner.ForwardFunc(func(p *engine.BatchPlan, logits []float32) error {
//			if r.kv == nil {
//				return cpurunner.ErrNotBound
//			}
//			return r.Model.Forward(p, r.kv, logits)
//		}))
//		return r
//	}
//
// Cache operations: a plan's CacheOps (a recurrent state restored from a prefix-cache
// checkpoint, a private copy of a shared block) must be in place before the forward reads
// the cache. The Runner does not declare engine.RunnerInfo.ExecutesCacheOps, so the engine
// executes them against its pool (the one the model is bound to) just before Execute, on
// the goroutine that calls Execute; a model's Forward never sees a page a pending op
// still has to write. Code that drives a Scheduler itself calls engine.ApplyCacheOps
// before Execute.
//
// CaptureLogits makes the runner compute the logits of every token row, not only of the
// rows the plan samples, and hand them to a callback: `generate --logits-out` writes them
// to a file to compare a model with a reference implementation.
package cpurunner
