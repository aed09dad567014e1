package router

// Several instances share a fleet (placement.go): each places a new
// conversation where every other would (rendezvous), and writes to the pin
// store only what they could not compute, a conversation served somewhere
// else than its rendezvous placement (the load bound or a failover moved
// it, its replica died, the cost policy balanced it) and every Responses
// API id. An instance that misses locally reads the store before it
// places: a read waits at most -pin-store-timeout, and a store that is
// down or slow is skipped, so a request never fails for it.

// storeLookback is how many links before a continuation's newest message
// the store is asked for: an agent turn adds an assistant message and one
// or more tool results, so the previous turn's last link is a few back.
const storeLookback = 4

// recordPins records that x.r answered: the local pins, and the store
// when the answer came from elsewhere than the request's rendezvous
// placement, or the conversation moved.
func (x *exchange) recordPins() {
	h := x.h
	policy := h.policy()
	Served(policy, x.req, x.r.Index, x.status, h.pins)
	st := h.cfg.PinStore
	if st == nil || x.status < 200 || x.status >= 300 || !policy.Needs().Pins {
		return
	}
	// Off its rendezvous top, or moved off the replica that held it (back
	// to the top, perhaps): either way other instances cannot compute it.
	moved := x.reason == Balanced || x.reason == Repinned || x.reason == Failover
	if n := len(x.req.Chain); n > 0 && (x.r.Index != x.top || moved) {
		st.Put(x.req.Chain[n-1], x.r.Name)
	}
}

// sharedPin asks the store about the turns of a continuation that this
// instance has not seen: the links newer than its own longest local pin
// (all of them, on a miss), at most storeLookback of them. A pin another
// instance recorded there is newer than what this one knows (that
// instance served a later turn, and moved it, or placed it off its
// rendezvous top), so it is pinned locally, where the policy finds it
// first; a replica that is gone here is repinned as any other. A turn
// whose previous turn this instance served asks nothing.
func (h *Handler) sharedPin(req *Request) {
	chain := req.Chain
	from := len(chain) - 2
	if req.Prompt {
		from = len(chain) - 1
	}
	if from < 0 {
		return
	}
	known := -1
	if _, i, ok := lookup(chain, len(chain)-1, h.pins); ok {
		known = i
	}
	if known >= from-1 {
		// This instance served the turn before: what follows is that
		// turn's reply, which no request ended with.
		return
	}
	for i := from; i > known && i > from-storeLookback; i-- {
		name, ok := h.cfg.PinStore.Get(chain[i])
		if !ok {
			continue
		}
		if r := h.set.Find([]byte(name)); r >= 0 {
			h.pins.Put(chain[i], r)
		}
		return
	}
}
