// Package prefixcache turns a request into chains of prefix hashes, and
// remembers which replica served each prefix and what each replica holds.
//
// A request is read as its canonical rendering (render.go): its system
// prompt and messages, role and text in the order a chat template lays
// them out, each string in its one canonical spelling (strCanon), so that
// key order, insignificant whitespace, string escapes (`\u00e9` and `é`,
// `\/` and `/`) and keys whose value is null change nothing, and any
// change to what an engine renders changes the rendering where it renders
// it. Most of a body's escapes are canonical already: they cost neither a
// copy nor a decoding. The rendering is hashed once, seeded by the model,
// the tools and vLLM's cache_salt, and read at two kinds of link: one
// every -prompt-chunk bytes and one at each message end (Chains.Blocks),
// and the message ends alone (Chains.Messages).
//
// The pin map is a sharded LRU from a Messages link to the replica that
// served that conversation. Holdings keep, for each replica, an LRU of the
// Blocks links of the prompts it prefilled, bounded by the bytes its
// caller gives (a few times the replica's KV capacity), so that the
// longest prefix of a prompt that a replica holds is found by binary
// search. Neither allocates per operation; the pin map's memory is
// fixed when it is made, and each replica's holdings when it is first
// sent a prompt.
package prefixcache
