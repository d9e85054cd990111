package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
)

// routeEndpoints adds the endpoints beside the OpenAI API that vLLM serves: /version,
// /tokenize, /detokenize, /tokenizer_info, and /debug/pprof/ when Config.EnablePprof is
// set.
func (s *Server) routeEndpoints(mux *http.ServeMux) {
	mux.Handle("GET /version", s.counted("/version", http.HandlerFunc(s.handleVersion)))
	mux.Handle("POST /tokenize", s.api("/tokenize", s.handleTokenize))
	mux.Handle("POST /detokenize", s.api("/detokenize", s.handleDetokenize))
	mux.Handle("GET /tokenizer_info", s.api("/tokenizer_info", s.handleTokenizerInfo))
	if !s.cfg.EnablePprof {
		return
	}
	profiles := func(h http.HandlerFunc) http.Handler {
		return s.api("/debug/pprof", func(w http.ResponseWriter, r *http.Request) error { h(w, r); return nil })
	}
	mux.Handle("GET /debug/pprof/", profiles(pprof.Index))
	mux.Handle("GET /debug/pprof/cmdline", profiles(pprof.Cmdline))
	mux.Handle("GET /debug/pprof/profile", profiles(pprof.Profile))
	mux.Handle("GET /debug/pprof/symbol", profiles(pprof.Symbol))
	mux.Handle("GET /debug/pprof/trace", profiles(pprof.Trace))
}

// buildVersion is the main module's version from the build information, or "devel".
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version, "model": s.cfg.Model})
}

// tokenizeRequest is the body of POST /tokenize: vLLM's completion form (prompt) or chat
// form (messages).
type tokenizeRequest struct {
	Model               string                       `json:"model"`
	Prompt              json.RawMessage              `json:"prompt"`
	Messages            []map[string]json.RawMessage `json:"messages"`
	AddSpecialTokens    *bool                        `json:"add_special_tokens"`
	AddGenerationPrompt *bool                        `json:"add_generation_prompt"`
	ReturnTokenStrs     bool                         `json:"return_token_strs"`
	Tools               []json.RawMessage            `json:"tools"`
	ChatTemplateKwargs  map[string]json.RawMessage   `json:"chat_template_kwargs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// handleTokenize tokenizes a prompt, or chat messages through the chat template, as the
// model would see them. Like vLLM it reports prompts longer than the context too (with
// max_model_len beside the count), but within the same byte bound and tokenizing budget
// as generation requests.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) error {
	var req tokenizeRequest
	if err := decodeBody(r.Body, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	hasPrompt := !absent(req.Prompt)
	var text, param string
	var addSpecial bool
	switch {
	case hasPrompt && req.Messages != nil:
		return invalid("messages", "Send either prompt or messages, not both.")
	case hasPrompt:
		param, addSpecial = "prompt", req.AddSpecialTokens == nil || *req.AddSpecialTokens
		if err := json.Unmarshal(req.Prompt, &text); err != nil {
			return invalid("prompt", "prompt must be a string.")
		}
	case req.Messages != nil:
		param, addSpecial = "messages", req.AddSpecialTokens != nil && *req.AddSpecialTokens
		if s.chat == nil {
			return invalid("messages", "The model %q has no chat template; send a prompt.", s.cfg.Model)
		}
		msgs, err := s.templateMessages(req.Messages)
		if err != nil {
			return err
		}
		opts := chatOptions(req.Tools, req.ChatTemplateKwargs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
		if text, err = s.chat.Render(msgs, opts); err != nil {
			return invalid("messages", "The chat template rejected the messages: %v.", err)
		}
	default:
		return invalid("prompt", "Send a prompt (a string) or messages.")
	}
	if len(text) > s.prompts.maxBytes {
		return promptTooLong(param, fmt.Sprintf("The prompt is %d bytes; this server tokenizes at most %d bytes.", len(text), s.prompts.maxBytes))
	}
	ids, err := s.encodeWithin(text, addSpecial)
	if err != nil {
		return asPromptError(err, param)
	}
	out := tokenizeResponse{Count: len(ids), MaxModelLen: s.eng.Info().MaxContext, Tokens: ids}
	if out.Tokens == nil {
		out.Tokens = []int32{}
	}
	if req.ReturnTokenStrs {
		// As vLLM's convert_ids_to_tokens: vocabulary strings (byte-level runes), not text.
		out.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			out.TokenStrs[i], _ = s.tok.Token(id)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

// handleDetokenize turns token ids back into text (special tokens included, as vLLM's
// /detokenize does).
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) error {
	var req detokenizeRequest
	if err := decodeBody(r.Body, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if req.Tokens == nil {
		return invalid("tokens", "tokens is required: an array of token ids.")
	}
	ids := make([]int32, len(req.Tokens))
	for i, id := range req.Tokens {
		if id < 0 || id >= int64(s.tok.VocabSize()) {
			return invalid("tokens", "Token id %d at position %d is outside the vocabulary [0, %d).", id, i, s.tok.VocabSize())
		}
		ids[i] = int32(id)
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": s.tok.Decode(ids, false)})
	return nil
}
