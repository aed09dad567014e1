package router

// affinity pins every request, and a miss picks by the hash of the first
// message, so that a same-prefix burst lands on one replica: kept to
// measure the cost of pinning everything (a cold burst of 16 requests that
// share a prefix took 30.1 s pinned against 18.6 s spread).
type affinity struct{}

func (affinity) String() string { return "affinity" }

func (affinity) Needs() Needs { return Needs{Pins: true} }

func (affinity) Choose(req Request) Decision {
	n := len(req.Chain)
	if n == 0 {
		return decision(place(&req), Spread, 0)
	}
	if r, i, ok := lookup(req.Chain, n-1, req.Pins); ok && req.Avail.Has(r) {
		return decision(r, Pinned, int64(req.Chain[i].Bytes()))
	} else if ok {
		return decision(req.Avail.Nth(req.Chain[0].Hash), Repinned, 0)
	}
	return decision(req.Avail.Nth(req.Chain[0].Hash), Hashed, 0)
}
