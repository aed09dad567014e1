package prefixcache

// Bytes is the size of the prefix that l covers: the decoded text of its
// messages, the bytes of a prompt's chunks, or the count of a token-id
// prompt's ids. It is what the cost policy weighs prefill work by, with
// no tokenizer: bytes are proportional to tokens for one kind of text.
func (l Link) Bytes() uint64 { return l.Check & (1<<40 - 1) }
