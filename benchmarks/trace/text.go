package trace

// words are what the pseudo-text is made of: prose-like, with a newline
// now and then, so that a JSON body escapes some of it as real text does.
var words = [...]string{
	"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
	"on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
	"they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
	"more", "when", "will", "would", "who", "so", "no", "model", "cache", "prompt", "token", "block",
	"replica", "answer", "question", "context", "window", "\"quoted\"", "(aside)", "list:", "data,", "end.",
}

// AppendText appends the first n bytes of the pseudo-text drawn from seed:
// a deterministic stream of words, the same for the same seed whatever n
// is, so that a shorter text is a prefix of a longer one, and unlike the
// stream of any other seed within its first few words.
func AppendText(dst []byte, seed uint64, n int) []byte {
	if n <= 0 {
		return dst
	}
	end := len(dst) + n
	s := seed
	for len(dst) < end {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		// Four words from each draw: 16 bits each, the low 6 the word
		// and the next 3 whether a newline follows it.
		for k := 0; k < 4 && len(dst) < end; k++ {
			v := uint16(z >> (16 * k))
			dst = append(dst, words[int(v&63)%len(words)]...)
			if v>>6&7 == 0 {
				dst = append(dst, '\n')
			} else {
				dst = append(dst, ' ')
			}
		}
	}
	return dst[:end]
}

// Seeds of the texts that are not a block's: an answer's, and the salt
// that keeps a block's text apart from any answer's.
const (
	blockSalt  = 0x243f6a8885a308d3
	answerSalt = 0x13198a2e03707344
)

// AppendBlock appends the first n bytes of block id's text: equal ids give
// equal text, different ids different text.
func AppendBlock(dst []byte, id uint64, n int) []byte {
	return AppendText(dst, id^blockSalt, n)
}
