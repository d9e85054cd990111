// Package pydemo is the py-demo inference runtime on Resin, with its model in Python.
//
// The engine (scheduling, the paged cache's bookkeeping, prefix caching, the HTTP server)
// is Resin's, in Go; the model is the Python package python/pydemo_runner, which the
// runtime starts as a child process and drives through Resin's runner protocol (core/wire):
// each step the engine sends a frozen BatchPlan and the runner answers with the sampled
// tokens. Start from the model's PyTorch (or numpy, or JAX) forward in
// python/pydemo_runner/model.py, check it against transformers, then port its kernels to
// Go and CUDA one at a time (CHECKLIST.md).
package pydemo
