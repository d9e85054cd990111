package tokenizer

import "maps"

// SpecialTokens returns the special tokens of the tokenizer_config.json the template
// was read from (bos_token, eos_token, pad_token, ...), by those names, as the template
// sees them; a template made from source alone has none.
func (c *ChatTemplate) SpecialTokens() map[string]string { return maps.Clone(c.tokens) }
