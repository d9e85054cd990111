package cpurunner

import "github.com/resin-llm/resin/core/engine"

// LogitsRow is the logits a model computed for one token row of a plan: after reading
// Token at Position of request ReqID, the distribution of the token at Position+1.
type LogitsRow struct {
	ReqID    uint64
	Position int32
	Token    int32
	// Logits (length = vocabulary) aliases the runner's buffer: it is valid only during
	// the callback.
	Logits []float32
}

// LogitsCapturer is implemented by runners that can hand out the logits of every token
// they compute; `generate --logits-out` needs one. CaptureLogits(nil) stops capturing.
type LogitsCapturer interface {
	CaptureLogits(fn func(LogitsRow))
}

var _ LogitsCapturer = (*Runner)(nil)

// CaptureLogits makes every later Execute compute the logits of every token row of its
// plan, not only of the rows the plan samples, and call fn with each of them, in plan
// order, on the goroutine that runs Execute. Sampling still reads the rows the plan asks
// for, so the generated tokens do not change. Rows of drafts the runner rejected are
// not reported (their positions come again with the right tokens). A prompt chunked over
// several steps is reported once per row; a prefix-cache hit skips the rows it covers (they are not
// computed), and a preempted sequence reports the rows it recomputes again. Memory: a
// step then holds tokens × vocabulary logits. Call it before the engine runs, or between
// steps from the engine's goroutine; nil stops capturing.
func (r *Runner) CaptureLogits(fn func(LogitsRow)) { r.capture = fn }

// allRowsPlan returns a shallow copy of plan whose logits rows are every token row, with
// index slices of the runner's own: the engine's plan and its arrays are never written.
func (r *Runner) allRowsPlan(plan *engine.BatchPlan) *engine.BatchPlan {
	r.all = *plan
	t := plan.NumTokens()
	if cap(r.allIdx) < t {
		r.allIdx = make([]int32, t)
	}
	r.allIdx = r.allIdx[:t]
	for k := range r.allIdx {
		r.allIdx[k] = int32(k)
	}
	r.allSt = append(r.allSt[:0], plan.QueryStart...)
	r.all.LogitsIndices, r.all.LogitsStart = r.allIdx, r.allSt
	return &r.all
}

// emit calls the capture callback with every token row of plan but those of rejected
// drafts (r.res holds the step's verdict).
func (r *Runner) emit(plan *engine.BatchPlan) {
	vocab := r.info.VocabSize
	for i := 0; i < plan.NumSeqs(); i++ {
		end := plan.QueryStart[i+1]
		if a := r.res.Accepted[i]; a > 0 {
			end -= plan.NumDrafts[i] - (a - 1)
		}
		for k := plan.QueryStart[i]; k < end; k++ {
			r.capture(LogitsRow{
				ReqID: plan.ReqIDs[i], Position: plan.Positions[k], Token: plan.Tokens[k],
				Logits: r.logits[int(k)*vocab : int(k+1)*vocab],
			})
		}
	}
}
