package prefixcache

import "github.com/cespare/xxhash/v2"

// A request's prompt is read as its canonical rendering: the bytes that
// stand for what an engine's chat template lays out, in its order. A
// system prompt that sits beside the messages (Anthropic's system, the
// Responses API's instructions) comes first, as a message with the role
// "system"; then each message: its role, its text members in a fixed
// order (content, text, thinking, output, arguments and function, then
// tool calls), each text spelled canonically (strCanon), and at its end
// an order-free hash of its other members (name, tool call id, a content
// part's type, an image). Key order, whitespace and escapes therefore do
// not change the rendering; any change of what an engine renders does, at
// the place where it renders it.
//
// The rendering goes to one digest. A link is taken every chunk bytes of
// it, wherever that falls, and at the end of each message, so that two
// requests whose renderings share their first N bytes share their first
// N/chunk links, whether the shared part is a whole message or a long
// document at the head of one. Those links are the Blocks chain, what a
// replica's cache is known by (Holdings); the links at message ends alone
// are the Messages chain, what conversations are pinned by (PinMap).

// rank orders the members of an object that the rendering writes in
// place; 0 for the rest, which go to the object's order-free hash.
func rank(k uint64) int {
	switch k {
	case keyRole:
		return 1
	case keyContent, keyText, keyThinking, keyOutput, keyArguments, keyFunction:
		return 2
	case keyToolCalls:
		return 3
	}
	return 0
}

var (
	keyRole      = hashString("role")
	keyContent   = hashString("content")
	keyText      = hashString("text")
	keyThinking  = hashString("thinking")
	keyOutput    = hashString("output")
	keyArguments = hashString("arguments")
	keyFunction  = hashString("function")
	keyToolCalls = hashString("tool_calls")
	// roleSystem and roleUser are the roles given to a system prompt that
	// sits beside the messages and to a Responses input that is one
	// string: each renders as the message that says the same.
	roleSystem = pair(keyRole, hashString("system"))
	roleUser   = pair(keyRole, hashString("user"))
	// tagItem marks the start of each part of a rendered array.
	tagItem = mix(tagArray, 1)
	// emptyRest is the order-free hash of an object with no other members.
	emptyRest = mix(tagObject, 0)
)

// maxSorted bounds the rendered members of one object read out of body
// order (renderSorted); more than that go to its order-free hash.
const maxSorted = 8

// renderer is the rendering as it is written: its digest, and the links
// taken so far. Each link's Hash is the digest's sum there, before the
// request's seed is folded in (finish); its Check is the text bytes there.
type renderer struct {
	d       xxhash.Digest
	chunk   int    // bytes between two chunk links; 0 for none
	pos     int    // bytes written
	next    int    // pos of the next chunk link
	last    int    // pos of the last link in blocks, -1 for none
	text    uint64 // text bytes written: canonical string bytes, and the decoded text of hashed members
	blocks  []Link
	msgs    []Link
	promptC bool // a completions prompt: its chunk links are its Messages chain too
}

func (r *renderer) reset(chunk int) {
	r.d.Reset()
	r.chunk, r.pos, r.next, r.last, r.text, r.promptC = chunk, 0, chunk, -1, 0, false
	r.blocks, r.msgs = r.blocks[:0], r.msgs[:0]
}

// feed writes p, text bytes if text is set, taking a link at each chunk
// boundary it crosses.
func (r *renderer) feed(p []byte, text bool) {
	for r.chunk > 0 && r.pos+len(p) >= r.next {
		take := r.next - r.pos
		r.d.Write(p[:take])
		r.pos += take
		if text {
			r.text += uint64(take)
		}
		p = p[take:]
		r.link(r.promptC)
		r.next += r.chunk
	}
	r.d.Write(p)
	r.pos += len(p)
	if text {
		r.text += uint64(len(p))
	}
}

// tag writes v, a hash that stands for something other than text.
func (r *renderer) tag(v uint64) {
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	r.feed(b[:], false)
}

// link takes a Blocks link here, and a Messages one too if msg is set.
func (r *renderer) link(msg bool) {
	l := Link{Hash: r.d.Sum64(), Check: r.text}
	if r.pos != r.last {
		r.blocks = append(r.blocks, l)
		r.last = r.pos
	}
	if msg {
		r.msgs = append(r.msgs, l)
	}
}

// finish folds the seed into every link and numbers them in Check.
func (r *renderer) finish(seed uint64) {
	for _, c := range [...][]Link{r.blocks, r.msgs} {
		for i := range c {
			c[i].Hash = mix(seed, c[i].Hash)
			c[i].Check = uint64(i+1)<<40 | c[i].Check&(1<<40-1)
		}
	}
}

// renderState is what renderSorted rewinds to.
type renderState struct {
	d                xxhash.Digest
	pos, next, last  int
	text             uint64
	blocks, msgs, at int
}

func (s *scanner) save() renderState {
	r := &s.r
	return renderState{d: r.d, pos: r.pos, next: r.next, last: r.last, text: r.text, blocks: len(r.blocks), msgs: len(r.msgs), at: s.i}
}

func (s *scanner) rewind(st *renderState) {
	r := &s.r
	r.d, r.pos, r.next, r.last, r.text = st.d, st.pos, st.next, st.last, st.text
	r.blocks, r.msgs, s.i = r.blocks[:st.blocks], r.msgs[:st.msgs], st.at
}

// renderMessages renders the array of messages (or Responses input items)
// at s.i, a link at the end of each.
func (s *scanner) renderMessages() {
	s.i++ // '['
	s.ws()
	if s.peek() == ']' {
		s.i++
		return
	}
	for {
		s.ws()
		s.renderItem(1)
		if s.err != nil {
			return
		}
		s.r.link(true)
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return
		default:
			s.fail(ErrMalformed)
			return
		}
	}
}

// renderAs renders the value at s.i as the content of a message with the
// given role member: a system prompt beside the messages, or a Responses
// input that is one string. It is the rendering of the message
// {"role":..., "content": value}.
func (s *scanner) renderAs(role uint64, roleLen int, msg bool) {
	s.r.tag(role)
	s.r.text += uint64(roleLen) // as hashed counts a role's text
	s.renderMember(keyContent, 1)
	s.r.tag(emptyRest)
	if s.err == nil {
		s.r.link(msg)
	}
}

// renderItem renders an element of a rendered array: an object member by
// member, a string as text, anything else by its hash.
func (s *scanner) renderItem(depth int) {
	switch s.peek() {
	case '{':
		s.renderObject(depth)
	case '"':
		s.renderString()
	default:
		s.hashed(0, depth)
	}
}

// hashed writes the hash of the value at s.i (of member k, 0 for an
// array element), counting its text.
func (s *scanner) hashed(k uint64, depth int) {
	text := s.text
	v := s.value(depth + 1)
	s.r.text += s.text - text
	if k != 0 {
		v = pair(k, v)
	}
	s.r.tag(v)
}

// renderString streams the string at s.i into the rendering.
func (s *scanner) renderString() {
	s.streaming = true
	s.strCanon()
	s.streaming = false
}

// renderObject renders the object at s.i: its ranked members in rank
// order, then its order-free hash of the rest. It reads the body in
// order and renders as it goes; an object whose ranked members come out
// of order (content before role, say) is rewound and read again by
// renderSorted.
func (s *scanner) renderObject(depth int) {
	if depth > maxDepth {
		s.fail(ErrTooDeep)
		return
	}
	if s.sorted {
		s.renderSorted(depth)
		return
	}
	st := s.save()
	s.i++ // '{'
	// The rest's hash and text go to the rendering at the object's end,
	// wherever its members stand in the body.
	var rest restHash
	lastRank, lastKey := 0, uint64(0)
	s.ws()
	if s.peek() == '}' {
		s.i++
		s.r.tag(emptyRest)
		return
	}
	for {
		s.ws()
		k, ok := s.key()
		if !ok {
			return
		}
		isNull := s.peek() == 'n'
		switch rk := rank(k); {
		case rk > 0 && !isNull:
			if rk < lastRank || rk == lastRank && k <= lastKey {
				// From here on every object is read as one out of
				// order: rendering objects nested in order, then
				// again sorted, level after level, would take time
				// exponential in their depth.
				s.rewind(&st)
				s.sorted = true
				s.renderSorted(depth)
				return
			}
			lastRank, lastKey = rk, k
			s.renderMember(k, depth)
		default:
			rest.add(s, k, isNull, depth)
		}
		if s.err != nil {
			return
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			rest.render(s)
			return
		default:
			s.fail(ErrMalformed)
			return
		}
	}
}

// restHash is the order-free hash of the members of an object that its
// rendering does not write in place, and their text bytes.
type restHash struct{ sum, n, text uint64 }

// add hashes the member k at s.i into h; a null value and a cache_control
// marker are as if absent.
func (h *restHash) add(s *scanner, k uint64, isNull bool, depth int) {
	before := s.text
	v := s.value(depth + 1)
	if k != keyCacheControl && !isNull {
		h.sum += pair(k, v)
		h.n++
		h.text += s.text - before
	}
}

// render writes the hash at the object's end.
func (h *restHash) render(s *scanner) {
	s.r.tag(mix(tagObject, h.sum^h.n))
	s.r.text += h.text
}

// renderSorted is renderObject for an object whose ranked members are out
// of rank order in the body: a first pass hashes the rest and notes where
// each ranked member is, then they are rendered in order.
func (s *scanner) renderSorted(depth int) {
	var at [maxSorted]struct {
		rank int
		key  uint64
		i    int
	}
	found := 0
	var rest restHash
	s.i++ // '{'
	for {
		s.ws()
		if s.peek() == '}' {
			break
		}
		// renderObject read this object only up to its first member
		// out of order: the rest may be malformed.
		k, ok := s.key()
		if !ok {
			return
		}
		isNull := s.peek() == 'n'
		if rk := rank(k); rk > 0 && !isNull && found < maxSorted {
			at[found].rank, at[found].key, at[found].i = rk, k, s.i
			found++
			s.value(depth + 1)
		} else {
			rest.add(s, k, isNull, depth)
		}
		if s.err != nil {
			return
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
		default:
			s.fail(ErrMalformed)
			return
		}
	}
	end := s.i + 1
	// Insertion sort: a message has a handful of ranked members.
	for i := 1; i < found; i++ {
		for j := i; j > 0 && (at[j].rank < at[j-1].rank || at[j].rank == at[j-1].rank && at[j].key < at[j-1].key); j-- {
			at[j], at[j-1] = at[j-1], at[j]
		}
	}
	for _, m := range at[:found] {
		s.i = m.i
		s.renderMember(m.key, depth)
		if s.err != nil {
			return
		}
	}
	s.i = end
	rest.render(s)
}

// renderMember renders the value at s.i of ranked member k: the role by
// its hash, text as it is, an array element by element, an object member
// by member.
func (s *scanner) renderMember(k uint64, depth int) {
	if k == keyRole {
		s.hashed(k, depth)
		return
	}
	switch s.peek() {
	case '"':
		s.r.tag(k)
		s.renderString()
	case '[':
		s.r.tag(k ^ tagArray)
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return
		}
		for {
			s.ws()
			// Each part is marked, so that ["ab","c"] and ["a","bc"],
			// which an engine renders apart, render apart.
			s.r.tag(tagItem)
			s.renderItem(depth + 1)
			if s.err != nil {
				return
			}
			s.ws()
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return
			default:
				s.fail(ErrMalformed)
				return
			}
		}
	case '{':
		s.r.tag(k ^ tagObject)
		s.renderObject(depth + 1)
	default:
		s.hashed(k, depth)
	}
}
