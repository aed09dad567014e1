package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/warmroute/warmroute/prefixcache"
)

// What each replica serves, learned from its GET /v1/models at start and
// after each good probe: a base model and, with vLLM's --enable-lora, each
// LoRA adapter as its own id. A request is routed only among the replicas
// that list its model. A replica that does not answer /v1/models (404, or
// not yet) serves every model, as before routing by model existed; one that
// fails to answer once keeps the list it gave last.

// servedModels is one replica's answer, as it wrote it.
type servedModels struct {
	ids     []string
	entries []json.RawMessage // each model object of its "data"
}

// modelTable is the snapshot that routing reads: for each model key
// (prefixcache.ModelKey), the replicas that list it, and the replicas that
// serve every model. It is rebuilt whenever a replica's list changes.
type modelTable struct {
	byKey map[uint64]Mask
	any   Mask
}

// ModelMask returns the replicas that serve the model with this key; key
// 0, a request that names no model, may go to any replica.
func (s *Set) ModelMask(key uint64) Mask {
	t := s.models.Load()
	if key == 0 || t == nil {
		return *s.all.Load()
	}
	return t.byKey[key].Or(t.any)
}

// fetchModels asks r for its models and records them.
func (r *Replica) fetchModels(ctx context.Context, client *http.Client) {
	status, body := r.get(ctx, client, "/v1/models")
	var list *servedModels
	switch status {
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		// No model list: it serves every model.
	default:
		return // keep what it said last
	case http.StatusOK:
		var answer struct {
			Data []json.RawMessage `json:"data"`
		}
		if json.Unmarshal(body, &answer) != nil {
			return
		}
		list = &servedModels{}
		for _, e := range answer.Data {
			var m struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(e, &m) == nil && m.ID != "" {
				list.ids = append(list.ids, m.ID)
				list.entries = append(list.entries, e)
			}
		}
		if len(list.ids) == 0 {
			list = nil // not a model list: it serves every model
		}
	}
	old := r.served.Load()
	if (old == nil) == (list == nil) && (list == nil || slices.Equal(old.ids, list.ids)) {
		return
	}
	r.served.Store(list)
	r.set.rebuildModels()
	if list == nil {
		r.set.cfg.Logger.Info("replica serves every model (no model list)", "replica", r.Name)
	} else {
		r.set.cfg.Logger.Info("replica models", "replica", r.Name, "models", strings.Join(list.ids, ","))
	}
}

func (s *Set) rebuildModels() {
	s.modelsMu.Lock()
	defer s.modelsMu.Unlock()
	t := &modelTable{byKey: map[uint64]Mask{}}
	for _, r := range s.Replicas() {
		list := r.served.Load()
		if list == nil {
			t.any.Add(r.Index)
			continue
		}
		for _, id := range list.ids {
			k := prefixcache.ModelKey(id)
			m := t.byKey[k]
			m.Add(r.Index)
			t.byKey[k] = m
		}
	}
	s.models.Store(t)
}

// ModelNames returns every model some replica lists, sorted.
func (s *Set) ModelNames() []string {
	var names []string
	for _, r := range s.Replicas() {
		if list := r.served.Load(); list != nil {
			names = append(names, list.ids...)
		}
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// ModelList returns the answer to GET /v1/models: the union of the live
// replicas' lists, each model once, as the replica that lists it first
// wrote it. It returns nil when no live replica has a list.
func (s *Set) ModelList() []byte {
	var b bytes.Buffer
	seen := map[string]bool{}
	for _, r := range s.Replicas() {
		list := r.served.Load()
		if list == nil || r.State() != Live {
			continue
		}
		for i, id := range list.ids {
			if seen[id] {
				continue
			}
			if len(seen) > 0 {
				b.WriteByte(',')
			}
			seen[id] = true
			b.Write(list.entries[i])
		}
	}
	if len(seen) == 0 {
		return nil
	}
	return append(append([]byte(`{"object":"list","data":[`), b.Bytes()...), "]}"...)
}
