package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// Tokenizer encodes text to token ids and decodes them back, as described by one
// tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	model     *bpe
	norm      normalizer
	pre       preTokenizer
	byteLevel bool // decode through the byte-level alphabet
	added     []AddedToken
	matcher   *addedMatcher
	post      *postProcessor

	idToToken []string
	special   []bool // by id: an added token marked special
	addedIDs  map[int32]bool
}

type fileSpec struct {
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         bpeSpec         `json:"model"`
}

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

// maxIDGap is how many ids a tokenizer.json may leave unused below its largest id.
const maxIDGap = 1 << 20

// Parse builds a tokenizer from the contents of a tokenizer.json file.
func Parse(data []byte) (*Tokenizer, error) {
	var spec fileSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %v: %w", err, ErrInvalid)
	}
	model, err := newBPE(spec.Model)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: model, added: spec.AddedTokens, addedIDs: map[int32]bool{}}
	if t.norm, err = parseNormalizer(spec.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, t.byteLevel, err = parsePreTokenizer(spec.PreTokenizer); err != nil {
		return nil, err
	}
	decByteLevel, err := parseDecoder(spec.Decoder)
	if err != nil {
		return nil, err
	}
	t.byteLevel = t.byteLevel || decByteLevel
	size := 0
	for _, id := range model.vocab {
		size = max(size, int(id)+1)
	}
	for _, a := range spec.AddedTokens {
		if a.ID < 0 {
			return nil, fmt.Errorf("added token %q has negative id %d: %w", a.Content, a.ID, ErrInvalid)
		}
		size = max(size, int(a.ID)+1)
	}
	if defined := len(model.vocab) + len(spec.AddedTokens); size > defined+maxIDGap {
		// The id tables are dense: a stray id of 2e9 would take 34 GB, not give an error.
		return nil, fmt.Errorf("token id %d is far beyond the %d tokens the file defines: %w", size-1, defined, ErrInvalid)
	}
	t.idToToken = make([]string, size)
	t.special = make([]bool, size)
	for tok, id := range model.vocab {
		if id < 0 {
			return nil, fmt.Errorf("token %q has negative id %d: %w", tok, id, ErrInvalid)
		}
		t.idToToken[id] = tok
	}
	for _, a := range spec.AddedTokens {
		t.idToToken[a.ID] = a.Content
		t.special[a.ID] = a.Special
		t.addedIDs[a.ID] = true
	}
	t.matcher = newAddedMatcher(t.added)
	if t.post, err = parsePostProcessor(spec.PostProcessor, t); err != nil {
		return nil, err
	}
	return t, nil
}

// VocabSize is one more than the largest token id, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// TokenID returns the id of a token string (model vocabulary or added token).
func (t *Tokenizer) TokenID(tok string) (int32, bool) {
	for i := range t.added {
		if t.added[i].Content == tok {
			return t.added[i].ID, true
		}
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// Token returns the token string of an id, in the model's alphabet (byte-level runes).
func (t *Tokenizer) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.idToToken) {
		return "", false
	}
	return t.idToToken[id], true
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// AddedTokens returns the added tokens in file order.
func (t *Tokenizer) AddedTokens() []AddedToken { return t.added }

// Encode turns text into token ids. Added and special tokens written in the text are
// recognized; addSpecial runs the post-processor (for example to prepend a BOS token).
// Each run of bytes that is not valid UTF-8 is encoded as one U+FFFD.
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	if !utf8.ValidString(text) {
		// The regexes see runes, so their byte offsets into invalid text would be wrong.
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	ids := make([]int32, 0, len(text)/3+4)
	var pieces []string
	for _, seg := range t.matcher.split(nil, text) {
		if seg.tok != nil {
			ids = append(ids, seg.tok.ID)
			continue
		}
		s := seg.text
		if t.norm != nil {
			s = t.norm.normalize(s)
		}
		pieces = append(pieces[:0], s)
		if t.pre != nil {
			var err error
			if pieces, err = t.pre.split(nil, pieces); err != nil {
				return nil, fmt.Errorf("encode: %w", err)
			}
		}
		for _, p := range pieces {
			ids = t.model.encode(ids, p)
		}
	}
	if addSpecial && t.post != nil {
		ids = t.post.apply(ids)
	}
	return ids, nil
}

// AppendBytes appends the bytes that token id stands for to dst. Special tokens are
// skipped when skipSpecial is set; unknown ids append nothing.
func (t *Tokenizer) AppendBytes(dst []byte, id int32, skipSpecial bool) []byte {
	if id < 0 || int(id) >= len(t.idToToken) {
		return dst
	}
	if skipSpecial && t.special[id] {
		return dst
	}
	tok := t.idToToken[id]
	if !t.byteLevel {
		return append(dst, tok...)
	}
	return byteLevelDecode(dst, tok)
}

// Decode turns ids back into text. Bytes that do not form valid UTF-8 become U+FFFD, one
// per maximal invalid sequence, as the reference does.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	var buf []byte
	for _, id := range ids {
		buf = t.AppendBytes(buf, id, skipSpecial)
	}
	return string(appendLossy(nil, buf))
}

// parseDecoder accepts the decoders a byte-level BPE uses and reports whether decoding
// goes through the byte-level alphabet.
func parseDecoder(raw json.RawMessage) (bool, error) {
	if isNull(raw) {
		return false, nil
	}
	var head struct {
		Type     string            `json:"type"`
		Decoders []json.RawMessage `json:"decoders"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return false, fmt.Errorf("decoder: %v: %w", err, ErrInvalid)
	}
	switch head.Type {
	case "ByteLevel":
		return true, nil
	case "Sequence":
		bl := false
		for _, d := range head.Decoders {
			b, err := parseDecoder(d)
			if err != nil {
				return false, err
			}
			bl = bl || b
		}
		return bl, nil
	}
	return false, fmt.Errorf("decoder %q: %w", head.Type, ErrUnsupported)
}
