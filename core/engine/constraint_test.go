package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/grammar"
)

// byteVocab is the test runner's vocabulary as bytes: ids 0..255 the bytes, then JSON
// pieces spanning several terminals, then EOS.
func byteVocab(t *testing.T, size int, eos int32) *grammar.Vocabulary {
	pieces := []string{`{"`, `":`, `",`, `": "`, `"}`, "true", "false", "  ", "\n", `"unit`, `celsius"`, "12", "34", ` "`, `},`}
	toks := make([][]byte, size)
	for b := 0; b < 256; b++ {
		toks[b] = []byte{byte(b)}
	}
	for k, p := range pieces {
		if 256+k < int(eos) {
			toks[256+k] = []byte(p)
		}
	}
	v, err := grammar.NewVocabulary(toks, []int32{eos}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const weatherSchema = `{"type": "object", "properties": {
	"unit": {"enum": ["celsius", "fahrenheit"]},
	"n": {"type": "integer", "minimum": -5, "maximum": 99},
	"ok": {"type": "boolean"},
	"tag": {"type": "string", "pattern": "^[a-z]{0,4}$"}},
	"required": ["unit", "n", "ok", "tag"]}`

type weather struct {
	Unit string `json:"unit"`
	N    *int   `json:"n"`
	OK   *bool  `json:"ok"`
	Tag  *string
}

// TestConstrainedOutputsValidate: through the engine, with the test runner's
// pseudo-random logits, sampled and greedy, plain, with drafts (rejected drafts roll the
// grammar back) and with Config.Async (the masks of a plan built ahead are filled once
// the step before it is applied), every output under a JSON schema parses and validates,
// and ends with EOS.
func TestConstrainedOutputsValidate(t *testing.T) {
	const vocab, eos = 300, 299
	v := byteVocab(t, vocab, eos)
	g, err := grammar.Compile(v, grammar.JSONSchema, weatherSchema)
	if err != nil {
		t.Fatal(err)
	}
	for name, rc := range map[string]enginetest.Config{
		"plain":        {VocabSize: vocab, EOS: []int32{eos}},
		"drafts":       {VocabSize: vocab, EOS: []int32{eos}, MaxDrafts: 3},
		"async":        {VocabSize: vocab, EOS: []int32{eos}, Async: true},
		"async drafts": {VocabSize: vocab, EOS: []int32{eos}, Async: true, MaxDrafts: 2},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := enginetest.New(rc)
			if err != nil {
				t.Fatal(err)
			}
			e, err := engine.New(r, engine.Config{Pool: r.Pool(), Async: rc.Async})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			go e.Run(ctx)
			defer e.Close()
			type out struct {
				toks   []int32
				finish engine.FinishReason
				err    error
			}
			results := make(chan out, 16)
			for i := 0; i < 16; i++ {
				m, err := g.NewMatcher()
				if err != nil {
					t.Fatal(err)
				}
				sp := engine.SamplingParams{MaxTokens: 1500, Seed: uint64(i), HasSeed: true, Constraint: m}
				if i%4 != 0 {
					sp.Temperature = 1.5
				}
				st, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2, int32(i)}, Sampling: sp})
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					var o out
					for {
						ev, err := st.Recv(ctx)
						if err != nil {
							o.err = err
							break
						}
						o.toks = append(o.toks, ev.Tokens...)
						if ev.Finish != engine.FinishNone {
							o.finish, o.err = ev.Finish, ev.Err
							break
						}
					}
					results <- o
				}()
			}
			for i := 0; i < 16; i++ {
				o := <-results
				if o.err != nil || o.finish != engine.FinishStop || len(o.toks) == 0 || o.toks[len(o.toks)-1] != eos {
					t.Fatalf("finish %v, err %v, tokens %v", o.finish, o.err, o.toks)
				}
				var text []byte
				for _, tok := range o.toks[:len(o.toks)-1] {
					text = append(text, tokenBytes(v, tok)...)
				}
				var w weather
				dec := json.NewDecoder(bytes.NewReader(text))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&w); err != nil {
					t.Fatalf("%q: %v", text, err)
				}
				if w.Unit != "celsius" && w.Unit != "fahrenheit" || w.N == nil || *w.N < -5 || *w.N > 99 || w.OK == nil || w.Tag == nil || len(*w.Tag) > 4 {
					t.Fatalf("%q does not validate", text)
				}
			}
			if err := r.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConstraintNeedsTokenMasks: a runner that does not apply masks, a mask of the wrong
// width and ignore_eos are refused at Submit.
func TestConstraintNeedsTokenMasks(t *testing.T) {
	const vocab, eos = 300, 299
	g, err := grammar.Compile(byteVocab(t, vocab, eos), grammar.Regex, "a+")
	if err != nil {
		t.Fatal(err)
	}
	r, err := enginetest.New(enginetest.Config{VocabSize: vocab, EOS: []int32{eos}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := g.NewMatcher()
	for name, c := range map[string]struct {
		runner engine.Runner
		sp     engine.SamplingParams
	}{
		"no masks":   {noMasks{r}, engine.SamplingParams{Constraint: m}},
		"ignore eos": {r, engine.SamplingParams{Constraint: m, IgnoreEOS: true}},
	} {
		e, err := engine.New(c.runner, engine.Config{Pool: r.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1}, Sampling: c.sp}); !errors.Is(err, engine.ErrInvalidRequest) {
			t.Errorf("%s: %v", name, err)
		}
		e.Close()
	}
	small, _ := grammar.Compile(byteVocab(t, 280, 279), grammar.Regex, "a+")
	m2, _ := small.NewMatcher()
	e, _ := engine.New(r, engine.Config{Pool: r.Pool()})
	defer e.Close()
	if _, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1}, Sampling: engine.SamplingParams{Constraint: m2}}); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Errorf("a mask of the wrong width: %v", err)
	}
}

type noMasks struct{ *enginetest.Runner }

func (n noMasks) Info() engine.RunnerInfo {
	i := n.Runner.Info()
	i.TokenMasks = false
	return i
}

func tokenBytes(v *grammar.Vocabulary, tok int32) []byte {
	if tok < 256 {
		return []byte{byte(tok)}
	}
	pieces := []string{`{"`, `":`, `",`, `": "`, `"}`, "true", "false", "  ", "\n", `"unit`, `celsius"`, "12", "34", ` "`, `},`}
	if int(tok-256) < len(pieces) {
		return []byte(pieces[tok-256])
	}
	panic(fmt.Sprintf("token %d has no bytes", tok))
}

// TestGrammarEndOverridesMinTokens: with min_tokens longer than everything the grammar
// allows, the grammar's end wins (as the sampler already lets it): regex "ab" under
// MinTokens 8 yields a, b, EOS and finishes with "stop", greedy and sampled.
func TestGrammarEndOverridesMinTokens(t *testing.T) {
	const vocab, eos = 300, 299
	g, err := grammar.Compile(byteVocab(t, vocab, eos), grammar.Regex, "ab")
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range []enginetest.Config{
		{VocabSize: vocab, EOS: []int32{eos}},
		{VocabSize: vocab, EOS: []int32{eos}, Async: true},
		{VocabSize: vocab, EOS: []int32{eos}, MaxDrafts: 2},
	} {
		r, err := enginetest.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		minTokensEngine(t, r, rc.Async, g, eos)
	}
}

func minTokensEngine(t *testing.T, r *enginetest.Runner, async bool, g *grammar.Grammar, eos int32) {
	t.Helper()
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), Async: async})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go e.Run(ctx)
	defer e.Close()
	for _, temp := range []float32{0, 1.5} {
		m, err := g.NewMatcher()
		if err != nil {
			t.Fatal(err)
		}
		sp := engine.SamplingParams{MaxTokens: 20, MinTokens: 8, Temperature: temp, Seed: 3, HasSeed: true, Constraint: m}
		st, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2}, Sampling: sp})
		if err != nil {
			t.Fatal(err)
		}
		var toks []int32
		for {
			ev, err := st.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, ev.Tokens...)
			if ev.Finish != engine.FinishNone {
				if ev.Finish != engine.FinishStop || ev.Err != nil || fmt.Sprint(toks) != fmt.Sprint([]int32{'a', 'b', eos}) {
					t.Fatalf("async %v, drafts %d, temperature %v: finish %v, err %v, tokens %v; want stop after [97 98 %d]", async, r.Info().MaxDrafts, temp, ev.Finish, ev.Err, toks, eos)
				}
				break
			}
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
}
