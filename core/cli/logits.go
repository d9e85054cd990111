package cli

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/weights"
)

// checkLogitsOut refuses a --logits-out path that cannot be written, before the model
// loads.
func checkLogitsOut(path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("--logits-out %s is a directory", path)
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("--logits-out: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("--logits-out: %s is not a directory", dir)
	}
	return nil
}

// logitsRecorder keeps the rows a capturing runner reports for the one request of a
// generate run, by position: a row computed twice (a preempted request recomputes) keeps
// the last, and a position never computed is reported by write.
type logitsRecorder struct {
	vocab  int
	req    uint64
	seen   bool
	logits []float32 // row p at p*vocab
	tokens []int64
	have   []bool
	err    error
}

func newLogitsRecorder(vocab int) *logitsRecorder { return &logitsRecorder{vocab: vocab} }

// add records one row; it runs on the engine's goroutine.
func (r *logitsRecorder) add(row cpurunner.LogitsRow) {
	if r.err != nil {
		return
	}
	switch {
	case !r.seen:
		r.req, r.seen = row.ReqID, true
	case row.ReqID != r.req:
		r.err = fmt.Errorf("rows of requests %d and %d: generate runs one request", r.req, row.ReqID)
		return
	}
	if len(row.Logits) != r.vocab || row.Position < 0 {
		r.err = fmt.Errorf("row at position %d has %d logits, want %d", row.Position, len(row.Logits), r.vocab)
		return
	}
	p := int(row.Position)
	for len(r.tokens) <= p {
		r.tokens = append(r.tokens, -1)
		r.have = append(r.have, false)
		r.logits = append(r.logits, make([]float32, r.vocab)...) // written below or refused by write
	}
	if r.have[p] && r.tokens[p] != int64(row.Token) {
		r.err = fmt.Errorf("position %d computed twice, for tokens %d and %d", p, r.tokens[p], row.Token)
		return
	}
	r.tokens[p], r.have[p] = int64(row.Token), true
	copy(r.logits[p*r.vocab:], row.Logits)
}

// write checks that every position from 0 to the last, and at least the prompt, has its
// row, and writes the file atomically.
func (r *logitsRecorder) write(path, model string, prompt, completion int) error {
	if r.err != nil {
		return fmt.Errorf("--logits-out: %w", r.err)
	}
	if len(r.tokens) < prompt {
		return fmt.Errorf("--logits-out: rows for %d positions, but the prompt has %d tokens", len(r.tokens), prompt)
	}
	for p, ok := range r.have {
		if !ok {
			return fmt.Errorf("--logits-out: position %d was never computed (a prefix-cache hit?)", p)
		}
	}
	n := len(r.tokens)
	ids := make([]byte, 8*n)
	for i, t := range r.tokens {
		binary.LittleEndian.PutUint64(ids[8*i:], uint64(t))
	}
	logits, err := weights.NewTensor("logits", weights.F32, []int{n, r.vocab}, r.logits)
	if err != nil {
		return fmt.Errorf("--logits-out: %w", err)
	}
	err = weights.WriteFile(path, []weights.Tensor{
		logits,
		{Name: "token_ids", DType: weights.I64, Shape: []int{n}, Data: ids},
	}, map[string]string{
		"model": model, "prompt_tokens": strconv.Itoa(prompt), "completion_tokens": strconv.Itoa(completion),
	})
	if err != nil {
		return fmt.Errorf("--logits-out: %w", err)
	}
	return nil
}

// captureLogits makes rt's runner report its logits to a new recorder, or says why it
// cannot.
func captureLogits(rt *Runtime) (*logitsRecorder, func(), error) {
	c, ok := rt.Runner.(cpurunner.LogitsCapturer)
	if !ok {
		name := rt.RunnerName
		if name == "" {
			name = rt.Runner.Info().Name
		}
		return nil, nil, fmt.Errorf("--logits-out: runner %s cannot capture logits", name)
	}
	rec := newLogitsRecorder(rt.Runner.Info().VocabSize)
	c.CaptureLogits(rec.add)
	return rec, func() { c.CaptureLogits(nil) }, nil
}
