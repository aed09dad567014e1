package router

// adaptive pins continuations to the replica that served their prefix and
// spreads everything else. It was the default until the cost policy
// measured as good or better on every workload: on a 24-turn agent loop it
// got 1095 ms warm-turn TTFT (2676 ms round-robin) and 19.97 s for a cold
// burst of 16 (18.6 s spread, 30.1 s pinned to one replica), but it
// spreads fresh requests blind to the work queued on each replica.
type adaptive struct{}

func (adaptive) String() string { return "adaptive" }

// Needs: it must not pin first messages, or a burst that shares a system
// prompt would go to one replica.
func (adaptive) Needs() Needs { return Needs{Pins: true} }

func (adaptive) Choose(req Request) Decision {
	n := len(req.Chain)
	from := -1
	switch {
	case req.Prompt && n > 0:
		// A prompt that extends one served before.
		from = n - 1
	case n > 1:
		// A continuation: its previous turn pinned a prefix that ends
		// before the newest messages.
		from = n - 2
	}
	if from >= 0 {
		if r, i, ok := lookup(req.Chain, from, req.Pins); ok {
			if req.Avail.Has(r) {
				return decision(r, Pinned, int64(req.Chain[i].Bytes()))
			}
			return decision(place(&req), Repinned, 0)
		}
	}
	return decision(place(&req), Spread, 0)
}
