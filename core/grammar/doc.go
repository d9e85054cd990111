// Package grammar constrains decoding to a grammar: a JSON Schema, any JSON object, a
// regular expression, a GBNF grammar or a list of choices, compiled against a tokenizer's
// vocabulary into a Matcher that gives, per step, the bitmask of the tokens allowed next
// and accepts the token sampled (with rollback for rejected speculative drafts).
//
// Every form compiles to the same thing: a context-free grammar over bytes, whose rules
// are runs of byte sets and rule references (repetition becomes right recursion, which
// the matcher runs as a tail call so that it does not grow the stack). The matcher is a
// pushdown automaton whose state is the set of parser stacks waiting on a byte; states
// are interned and their byte transitions kept, so it runs as a lazily built DFA. A mask
// is a walk of the vocabulary's token trie (built once per Vocabulary), skipping a
// subtree as soon as its prefix is refused. The walk is made from the state cut below
// its stacks' top frames, so it holds for every state with the same top (a string is a
// string whatever object it is in): it sorts tokens into allowed, refused and dependent
// on the context, and only the last are checked against the state itself (xgrammar's
// context-independent tokens). Both the walks and the masks are cached: inside a JSON
// string or number the state repeats from token to token, so most masks are a lookup.
//
// Tokens are matched by their bytes, so a byte-level BPE token may span grammar
// terminals or end inside a UTF-8 character. Special tokens are never allowed; EOS is
// allowed exactly where the grammar can end.
//
// A grammar that is too large (Limits in expr.go) or uses a feature the compiler cannot
// enforce is refused by Compile with an error naming it, before any request waits on it.
// The JSON Schema subset is xgrammar's and llguidance's: type (and type lists),
// properties, required, additionalProperties (none by default beside properties: strict
// mode), enum, const, items, prefixItems, minItems, maxItems, minLength, maxLength,
// pattern (RE2 syntax; unanchored sides allow any text, as JSON Schema says), the formats
// date, time, date-time, uuid and ipv4 (others are annotations, ignored), minimum,
// maximum, exclusiveMinimum and exclusiveMaximum on integers and (integer-valued, the
// numbers then written without exponent) on numbers, anyOf and oneOf (oneOf's exclusivity not enforced), allOf
// of one schema, local $ref with $defs/definitions (recursion allowed) and OpenAPI's
// nullable. Objects list their properties in the schema's order; an extra property's key
// is any string but a declared property's name (when the names are printable ASCII).
package grammar
