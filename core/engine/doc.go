// Package engine owns requests and decides, every step, what the model runs.
//
// A client submits a Request to an Engine and reads its Stream: new tokens (with logprobs
// when asked), then exactly one terminal event with a FinishReason. The Engine's loop
// (Run) asks the Scheduler for a frozen BatchPlan, hands it to the Runner (the one
// interface a model implements), and feeds the StepResult back to the Scheduler, which
// appends tokens, checks stop conditions, commits full blocks to the prefix cache of
// core/kvslab, rolls back rejected speculative tokens and frees finished sequences.
//
// The scheduler follows one rule: every running request is offered wanted − computed
// tokens (a prompt chunk, one decode token, or 1+k with k drafts), capped by the step's
// token budget; running requests go first, then waiting ones (FCFS or priority). Prefix
// cache hits are taken at admission; when pages run out the newest (or lowest-priority)
// running request is preempted by recompute.
//
// With Config.Async (a runner that declares AsyncTokens) the loop builds plan N+1 while the
// runner executes plan N, so scheduling hides behind the model's step. Nothing the
// scheduler does while N runs writes a cache page: the page copies kvslab needs (a
// recurrent state restored on a prefix hit, copy-on-write of a shared block) travel in
// the plan as CacheOps, which the runner (or, for a runner that leaves them, the engine
// on the runner's goroutine) executes before the forward of the step that carries them,
// so after N. Pages freed while N runs (finished or preempted requests, sliding-window
// blocks left behind, checkpoints beyond a sequence's quota) may be handed out in N+1,
// but only N+1, after N, writes them. The window blocks and checkpoints that N itself
// completes stay until Update commits them (kvslab.Pool.ReserveInFlight), so Async
// caches the same prefixes. Sliding windows and recurrent groups therefore overlap like
// full attention. With a drafting runner, a plan is built ahead only while
// the plan in flight samples nothing (prompt chunks): a step that verifies or proposes
// drafts decides where its sequences continue, so the next step waits for its result.
//
// Each plan also lists the requests whose pages were freed since the previous plan
// (Released), so a runner that keeps per-request state drops it.
//
// The engine never touches model math and the runner never decides what to run: the
// BatchPlan is the whole contract between them, and it has a versioned binary encoding so
// it can cross a process boundary.
package engine
