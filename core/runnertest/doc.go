// Package runnertest is a conformance suite for engine.Runner implementations. Run drives
// a runner through the real engine (core/engine) and checks what every correct runner
// does, whatever the model:
//
//   - prefill equals token-by-token decode, and a chunked prefill equals a one-shot one;
//   - a sequence's output does not depend on what else is in the batch, nor on where its
//     pages sit in a fragmented pool;
//   - greedy and seeded sampling are reproducible;
//   - a prefix-cache hit gives the tokens a cold run gives;
//   - an aborted request, running or waiting, gives back its pages;
//   - a runner that proposes drafts gives what the same model without them gives
//     (Options.Plain), greedy and seeded.
//
// Outputs are compared on the generated tokens and on their log probabilities (the chosen
// token's and the top alternatives'), within Options.Tolerance. After every check the
// pool must be consistent, hold no sequence and be whole once its prefix cache is cleared.
//
// Plan, OpenSeq and Seq build batch plans by hand, for tests that call a runner or a
// model's forward directly, for every kind of cache group and with drafts to verify;
// Settle applies a runner's verdict on the drafts as the engine does.
package runnertest
