package router

import (
	"bytes"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/prefixcache"
	"github.com/warmroute/warmroute/upstream"
)

// The Responses API keeps state on the replica that answered: vLLM stores a
// response in that server's memory, so a request whose previous_response_id
// names it must go there, under every policy, or it fails with "not found".
// The proxy records the id of each answer (the JSON body's, or the
// response.created event's of a stream) in a bounded map, and follows it.

// responseCapacity bounds the ids remembered: 65536 conversations' last
// turns, about 2 MiB. The oldest go first; a forgotten id is routed as a
// new conversation would be.
const responseCapacity = 1 << 16

// responseIDWithin is how far into a stream its id is looked for: the
// response.created event comes first.
const responseIDWithin = 16 << 10

var (
	strIDKey      = []byte(`"id"`)
	strPrevKey    = []byte(`"previous_response_id"`)
	strCreatedID  = []byte(`"response":{"id":"`)
	responseSeed  = uint64(0x7E5_9095E)
	responseCheck = uint64(0xC0_FFEE_7E5)
)

func responseLink(id []byte) prefixcache.Link {
	return prefixcache.Link{Hash: xxhash.Sum64(id) ^ responseSeed, Check: xxhash.Sum64(id) + responseCheck}
}

func (h *Handler) recordResponse(id []byte, replica int) {
	if len(id) == 0 {
		return
	}
	h.responses.Put(responseLink(id), replica)
	if st := h.cfg.PinStore; st != nil {
		if r := h.set.Replica(replica); r != nil {
			st.PutID(string(id), r.Name) // another instance may get the next turn
		}
	}
}

// storedResponse finds the replica of a Responses id that another instance
// recorded, through the pin store.
func (h *Handler) storedResponse(id []byte) (int, bool) {
	if h.cfg.PinStore == nil {
		return 0, false
	}
	name, ok := h.cfg.PinStore.GetID(string(id))
	if !ok {
		return 0, false
	}
	r := h.set.Find([]byte(name))
	if r >= 0 {
		h.responses.Put(responseLink(id), r)
	}
	return r, true // -1: it lived on a replica that has left the set
}

// recordStreamedID records the id of a Responses stream on replica from
// its response.created event, and reports whether p held it.
func (h *Handler) recordStreamedID(p []byte, replica int) bool {
	i := bytes.Index(p, strCreatedID)
	if i < 0 {
		return false
	}
	rest := p[i+len(strCreatedID):]
	if j := bytes.IndexByte(rest, '"'); j > 0 {
		h.recordResponse(rest[:j], replica)
		return true
	}
	return false
}

// followResponse routes a Responses request that continues a stored
// response to the replica that holds it, and reports whether the request
// may go on: when that replica is gone, it is answered at once with the
// error a replica gives for an unknown id, saying why.
func (h *Handler) followResponse(x *exchange) bool {
	prev := stringOf(x.body, strPrevKey)
	if len(prev) == 0 {
		return true
	}
	idx, ok := h.responses.Get(responseLink(prev))
	if !ok {
		idx, ok = h.storedResponse(prev)
	}
	if !ok {
		return true // not one of ours, or forgotten: the replicas decide
	}
	if r := h.replicaOrNil(idx); r == nil || !r.Serving() {
		x.answerOwn(fasthttp.StatusNotFound, goneResponseBody(prev))
		return false
	}
	x.serves = [len(x.serves)]uint64{}
	x.serves.Add(idx)
	x.prevResponse = prev
	return true
}

func (h *Handler) replicaOrNil(idx int) *upstream.Replica {
	if idx < 0 {
		return nil
	}
	return h.set.Replica(idx)
}
