package tokenizer

// byteToRune maps each byte to the printable rune GPT-2's byte-level BPE uses for it:
// printable Latin-1 bytes map to themselves, the rest to runes from U+0100 upwards.
var byteToRune [256]rune

// runeToByte is the inverse of byteToRune.
var runeToByte = map[rune]byte{}

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelEncode maps every byte of s to its byte-level rune.
func byteLevelEncode(s string) string {
	out := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = byteToRune[s[i]]
	}
	return string(out)
}

// byteLevelDecode appends the bytes a byte-level token stands for to dst. A token holding
// a rune outside the byte-level alphabet (an added token such as "<｜end▁of▁sentence｜>")
// contributes its own UTF-8 bytes, as the reference decoder does.
func byteLevelDecode(dst []byte, tok string) []byte {
	start := len(dst)
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], tok...)
		}
		dst = append(dst, b)
	}
	return dst
}
