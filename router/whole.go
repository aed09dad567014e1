package router

import (
	"bytes"

	"github.com/warmroute/warmroute/upstream"
)

// An answer that a replica frames with neither a length nor chunking ends
// when the replica closes its connection, and a close in the middle of it
// looks just like its end: the framing cannot tell, so the content does.
// A JSON answer read whole must hold a whole JSON object or array, or the
// client gets a 502 and the replica is demoted (upstream.SignCut); an SSE
// stream of a known API must have sent the API's last event, or the
// client's stream is cut as a broken chunked one is. Answers framed by a
// length or by chunks are not checked: their framing says whether they
// are whole.

// errAnswerCut and errStreamEnded are the failures of an answer that the
// replica's close cut short, read whole and streamed.
var (
	errAnswerCut   = &upstream.Error{Phase: upstream.PhaseBody, Sign: upstream.SignCut, Err: upstream.ErrCut}
	errStreamEnded = &upstream.Error{Phase: upstream.PhaseStream, Sign: upstream.SignCut, Err: upstream.ErrCut}
)

// The events that end a stream of each API, one of which a whole stream
// has sent: chat and completions end with data: [DONE] (an error inside
// the stream is followed by it too), Messages with message_stop or an
// error event, a Responses stream with its response's final state or an
// error event.
var (
	endsChat      = [][]byte{[]byte("[DONE]")}
	endsMessages  = [][]byte{[]byte("message_stop"), []byte("event: error")}
	endsResponses = [][]byte{[]byte("response.completed"), []byte("response.incomplete"), []byte("response.failed"), []byte("event: error")}
)

// hasAny reports whether p holds one of marks.
func hasAny(p []byte, marks [][]byte) bool {
	for _, m := range marks {
		if bytes.Contains(p, m) {
			return true
		}
	}
	return false
}

// jsonWhole reports whether b holds a JSON object or array that ends: its
// brackets close, outside strings, back to the top level. It does not
// validate the JSON (the replica's JSON is the client's to read); it tells
// a whole answer from one cut short, whose brackets never close, in one
// pass over b without allocating.
func jsonWhole(b []byte) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			// Skip the string: to its closing quote, the loop's i++
			// steps past it.
			_, next := readName(b, i)
			if next < 0 {
				return false
			}
			i = next - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return true
			}
		}
	}
	return false
}
