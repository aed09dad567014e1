// Package prefixcache turns a chat request into a chain of prefix hashes and
// remembers which replica served each prefix.
//
// A chat request is canonicalized by meaning, not by JSON spelling: key order,
// insignificant whitespace, string escapes (`\u00e9` and `é`, `\/` and `/`)
// and keys whose value is null do not change a message's hash; any change to
// a value does. A string is hashed by its canonical spelling, one per
// decoded string (see strCanon), which most of a body's escapes are in
// already: they cost neither a copy nor a decoding. The chain has one link
// per message boundary: link i covers messages 0..i, seeded by the model
// and the tools array, which shape the prompt before the first message.
//
// The pin map is a sharded LRU from a link's hash to the replica that served
// that prefix. It allocates nothing per operation and its memory is fixed at
// construction.
package prefixcache
