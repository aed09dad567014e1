package trace

import (
	"fmt"

	"github.com/warmroute/warmroute/benchmarks/workload"
)

// Rendering is how a trace's request becomes chat messages.
type Rendering int

const (
	// Turns reconstructs conversations: a request whose blocks extend an
	// earlier request's whole blocks continues that request's
	// conversation, as its messages, an assistant message (the earlier
	// request's answer) and a user message with the new blocks. The
	// earlier request's rendered prompt ends where its answer would
	// begin, so a chat template renders the continuation's prompt as the
	// earlier prompt followed by more: the engine finds the earlier
	// prompt whole in its cache. A request that continues none opens a
	// conversation: a system message with the blocks that every request
	// of the window opens with (the service's system prompt), then a user
	// message with the rest of its blocks.
	Turns Rendering = iota
	// OnePrompt sends each prompt as one user message, the text of its
	// blocks in order: a shared prefix lies inside the message.
	OnePrompt
)

// Renderings are every rendering, in the order the benchmark runs them.
var Renderings = [...]Rendering{Turns, OnePrompt}

func (r Rendering) String() string {
	switch r {
	case Turns:
		return "turns"
	case OnePrompt:
		return "prompt"
	}
	return fmt.Sprintf("Rendering(%d)", int(r))
}

// minUser is the fewest tokens of a continuation's new user message:
// half of the trace's continuations add 22 tokens or fewer beyond the
// earlier prompt and its answer, and some add fewer than the answer had
// (the answer is then cut to leave the user message these).
const minUser = 16

// Rendered is a window rendered one way.
type Rendered struct {
	// Messages holds each request's messages, in the window's order.
	Messages [][]workload.Message
	// Parent is, for each request, the index of the request whose
	// conversation it continues, or -1. OnePrompt continues none.
	Parent []int
}

// Continued is the number of requests that continue a conversation.
func (r Rendered) Continued() int {
	n := 0
	for _, p := range r.Parent {
		if p >= 0 {
			n++
		}
	}
	return n
}

// Render renders reqs with bytesPerToken bytes of text per trace token:
// a block of the trace is BlockTokens*bytesPerToken bytes of its id's
// text (AppendBlock), a prompt's last block what its length leaves of
// its id's text.
func Render(reqs []Request, how Rendering, bytesPerToken float64) Rendered {
	bytes := func(tokens int) int { return max(int(float64(tokens)*bytesPerToken+0.5), 0) }
	blockBytes := max(bytes(BlockTokens), 1)
	// text is n bytes of r's blocks from the from-th on.
	text := func(r Request, from, n int) string {
		b := make([]byte, 0, max(n, 0))
		for i := from; i < len(r.Blocks) && len(b) < n; i++ {
			b = AppendBlock(b, r.Blocks[i], min(blockBytes, n-len(b)))
		}
		return string(b)
	}
	out := Rendered{Messages: make([][]workload.Message, len(reqs)), Parent: make([]int, len(reqs))}
	if how == OnePrompt {
		for i, r := range reqs {
			out.Parent[i] = -1
			out.Messages[i] = []workload.Message{{Role: "user", Content: text(r, 0, bytes(r.Input))}}
		}
		return out
	}

	sys := commonBlocks(reqs)
	var system string
	if sys > 0 {
		system = text(reqs[0], 0, sys*blockBytes)
	}
	// byPrefix holds the requests whose whole blocks hash to a key, in
	// order.
	byPrefix := map[uint64][]int{}
	prefix := make([]uint64, 0, 256)
	for j, c := range reqs {
		prefix = prefix[:0]
		h := prefixSeed
		for _, id := range c.Blocks {
			h = extend(h, id)
			prefix = append(prefix, h)
		}
		parent := -1
		// The latest request with the most whole blocks that c extends,
		// and is shorter than c.
	find:
		for k := len(prefix); k > sys; k-- {
			ps := byPrefix[prefix[k-1]]
			for i := len(ps) - 1; i >= 0; i-- {
				if reqs[ps[i]].Input < c.Input {
					parent = ps[i]
					break find
				}
			}
		}
		out.Parent[j] = parent
		if parent >= 0 {
			p := reqs[parent]
			answer := min(max(c.Input-p.Input-minUser, 1), max(p.Output, 1))
			user := max(c.Input-p.Input-answer, 1)
			seed := prefix[p.Full()-1] ^ uint64(p.Input)<<40 ^ answerSalt
			prev := out.Messages[parent]
			msgs := make([]workload.Message, len(prev), len(prev)+2)
			copy(msgs, prev)
			out.Messages[j] = append(msgs,
				workload.Message{Role: "assistant", Content: string(AppendText(nil, seed, bytes(answer)))},
				workload.Message{Role: "user", Content: text(c, p.Full(), bytes(user))})
		} else {
			var msgs []workload.Message
			if sys > 0 {
				msgs = append(msgs, workload.Message{Role: "system", Content: system})
			}
			out.Messages[j] = append(msgs, workload.Message{Role: "user",
				Content: text(c, sys, max(bytes(c.Input)-sys*blockBytes, 1))})
		}
		if f := c.Full(); f > sys {
			byPrefix[prefix[f-1]] = append(byPrefix[prefix[f-1]], j)
		}
	}
	return out
}

// commonBlocks is the number of whole blocks that every request of reqs
// opens with; 0 for fewer than two requests.
func commonBlocks(reqs []Request) int {
	if len(reqs) < 2 {
		return 0
	}
	n := reqs[0].Full()
	for _, r := range reqs[1:] {
		n = min(n, r.Full())
		for i := 0; i < n; i++ {
			if r.Blocks[i] != reqs[0].Blocks[i] {
				n = i
				break
			}
		}
	}
	return n
}
