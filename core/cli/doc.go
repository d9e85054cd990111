// Package cli holds the cobra commands a Resin runtime is made of: generate, serve,
// bench and kernels, the profiling flags, tokenizer loading and starting and stopping the
// engine. The commands are parameterised by a Loader, which registers the flags that
// choose a model and loads it; ModelDir is the Loader of a runtime built for one model
// (the cmd/NAME of a scaffold), and cmd/resin brings its own (the model registry and the
// engine's test runner). A runtime's main.go is then only wiring, and a fix here reaches
// every runtime.
package cli
