package serve

import (
	"net/http"
	"strconv"
)

// fastTokenizerClass is what transformers' AutoTokenizer builds from a tokenizer.json
// alone, the file Resin's tokenizer reads.
const fastTokenizerClass = "PreTrainedTokenizerFast"

// handleTokenizerInfo answers GET /tokenizer_info as vLLM does: the tokenizer's
// configuration (its tokenizer_config.json keys) for clients that tokenize through the
// server, as lm-eval's remote tokenizer does (it reads eos_token, bos_token, pad_token
// and chat_template, then encodes through /tokenize). Resin reports what it holds: the
// special tokens, the context length as model_max_length, the added tokens by id, and
// the chat template when the model has one.
func (s *Server) handleTokenizerInfo(w http.ResponseWriter, r *http.Request) error {
	info := map[string]any{
		"tokenizer_class":  fastTokenizerClass,
		"model_max_length": s.eng.Info().MaxContext,
	}
	if s.chat != nil {
		for name, tok := range s.chat.SpecialTokens() {
			info[name] = tok
		}
		info["chat_template"] = s.chat.Source()
	}
	if _, ok := info["eos_token"]; !ok {
		// Without a tokenizer_config.json, the runner's first end-of-sequence token.
		if eos := s.eng.Info().EOS; len(eos) > 0 {
			if tok, ok := s.tok.Token(eos[0]); ok {
				info["eos_token"] = tok
			}
		}
	}
	added := map[string]string{}
	for _, t := range s.tok.AddedTokens() {
		added[strconv.Itoa(int(t.ID))] = t.Content
	}
	info["added_tokens_decoder"] = added
	writeJSON(w, http.StatusOK, info)
	return nil
}
