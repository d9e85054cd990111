package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/resin-llm/resin/core/tokenizer"
)

// A counter counts the tokens a prompt takes in the served model.
type counter interface {
	count(ctx context.Context, text string) (int, error)
}

// Names of the ways prompt tokens are counted, as the report gives them.
const (
	CountedByServer    = "server /tokenize"
	CountedByTokenizer = "local tokenizer"
	CountedByWords     = "words (approximation)"
)

// serverTokenizer counts with the server's POST /tokenize {"model","prompt"} →
// {"tokens","count"} (vLLM's endpoint; special tokens are added as for a completion).
type serverTokenizer struct {
	hc  *http.Client
	cfg *Config
}

// errNoTokenize is what serverTokenizer.count returns when the server has no /tokenize.
var errNoTokenize = errors.New("the server has no /tokenize")

func (s serverTokenizer) count(ctx context.Context, text string) (int, error) {
	resp, err := post(ctx, s.hc, s.cfg, "/tokenize", map[string]string{"model": s.cfg.Model, "prompt": text}, "")
	if err != nil {
		return 0, fmt.Errorf("POST /tokenize: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return 0, errNoTokenize
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("POST /tokenize: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	var out struct {
		Tokens []int32 `json:"tokens"`
		Count  *int    `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("POST /tokenize: bad answer: %w", err)
	}
	if out.Count != nil {
		return *out.Count, nil
	}
	return len(out.Tokens), nil
}

// localTokenizer counts with a tokenizer.json, special tokens added as a server adds them
// to a completion's prompt.
type localTokenizer struct{ tok *tokenizer.Tokenizer }

func (l localTokenizer) count(_ context.Context, text string) (int, error) {
	ids, err := l.tok.Encode(text, true)
	return len(ids), err
}

// wordCounter approximates tokens by words.
type wordCounter struct{}

func (wordCounter) count(_ context.Context, text string) (int, error) {
	return len(strings.Fields(text)), nil
}

// pickCounter returns the most faithful counter available: the server's /tokenize when it
// answers, else cfg.Tokenizer, else words, with a warning naming the approximation.
func pickCounter(ctx context.Context, hc *http.Client, cfg *Config) (counter, string, string, error) {
	server := serverTokenizer{hc: hc, cfg: cfg}
	_, err := server.count(ctx, words[0])
	switch {
	case err == nil:
		return server, CountedByServer, "", nil
	case !errors.Is(err, errNoTokenize):
		return nil, "", "", err
	case cfg.Tokenizer != nil:
		return localTokenizer{cfg.Tokenizer}, CountedByTokenizer, "", nil
	}
	return wordCounter{}, CountedByWords, fmt.Sprintf("prompt length counted in words, not tokens: "+
		"the server has no /tokenize and no tokenizer was given (--tokenizer); prompts of %d words "+
		"may be several times longer in tokens (see the mean prompt tokens in the report)", cfg.PromptLen), nil
}
