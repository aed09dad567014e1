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

// served records that x.r answered: the local pins, and the store when
// the answer came from elsewhere than the request's rendezvous placement.
func (x *exchange) served() {
	h := x.h
	Served(h.cfg.Policy, x.req, x.r.Index, x.status, h.pins)
	st := h.cfg.PinStore
	if st == nil || x.status < 200 || x.status >= 300 || h.cfg.Policy == RoundRobin {
		return
	}
	if n := len(x.req.Chain); n > 0 && x.r.Index != x.top {
		st.Put(x.req.Chain[n-1], x.r.Name)
	}
}

// sharedPin looks a continuation that no local pin places up in the store,
// and pins what another instance recorded for it locally, where the policy
// finds it: a replica that is gone here is repinned as any other.
func (h *Handler) sharedPin(x *exchange) {
	chain := x.req.Chain
	from := len(chain) - 2
	if x.req.Prompt {
		from = len(chain) - 1
	}
	if from < 0 {
		return
	}
	// Any local pin of the chain, its last link included (the same
	// request again), means this instance knows the conversation.
	if _, _, ok := lookup(chain, len(chain)-1, h.pins); ok {
		return
	}
	for i := from; i >= 0 && i > from-storeLookback; i-- {
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
