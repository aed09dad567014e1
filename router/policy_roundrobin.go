package router

// roundRobin spreads every request by counter and keeps no pins: the
// baseline that pinning is measured against.
type roundRobin struct{}

func (roundRobin) String() string { return "roundrobin" }

func (roundRobin) Needs() Needs { return Needs{} }

func (roundRobin) Choose(req Request) Decision {
	return decision(spread(&req), Spread, 0)
}
