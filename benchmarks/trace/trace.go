// Package trace reads request traces in the Mooncake format (one JSON
// object a line: arrival time, input and output length, and the ids of
// each prompt's 512-token blocks) and renders their requests as chat
// requests whose text shares exactly the prefixes that the trace says
// they share, so that a replay through a proxy and real or simulated
// replicas finds what the trace's own service could have cached.
package trace

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// BlockTokens is the trace's block size: each id covers 512 tokens of
// the prompt, the last one what is left.
const BlockTokens = 512

// Request is one request of a trace.
type Request struct {
	// At is the arrival time after the trace's start.
	At time.Duration
	// Input and Output are the prompt's and the answer's tokens.
	Input, Output int
	// Blocks holds an id for each BlockTokens of the prompt: two requests
	// whose first k ids are equal have equal first k blocks.
	Blocks []uint64
}

// Full returns the number of whole blocks of r's prompt: the last id
// covers fewer than BlockTokens tokens unless Input is a multiple of it.
func (r Request) Full() int { return min(r.Input/BlockTokens, len(r.Blocks)) }

// line is one line of a Mooncake trace.
type line struct {
	Timestamp    int64    `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Load reads a trace file, .jsonl or .jsonl.gz.
func Load(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("cannot read trace %s: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	reqs, err := Read(r)
	if err != nil {
		return nil, fmt.Errorf("cannot read trace %s: %w", path, err)
	}
	return reqs, nil
}

// Read reads a trace of one JSON object a line; blank lines are skipped.
// A request must have an id for every BlockTokens of its input, as the
// Mooncake traces do.
func Read(r io.Reader) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var l line
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if l.InputLength < 1 || l.OutputLength < 0 || l.Timestamp < 0 ||
			len(l.HashIDs) != (l.InputLength+BlockTokens-1)/BlockTokens {
			return nil, fmt.Errorf("line %d: %d ids for %d input tokens, %d output tokens at %d ms: want one id per %d tokens",
				n, len(l.HashIDs), l.InputLength, l.OutputLength, l.Timestamp, BlockTokens)
		}
		out = append(out, Request{At: time.Duration(l.Timestamp) * time.Millisecond,
			Input: l.InputLength, Output: l.OutputLength, Blocks: l.HashIDs})
	}
	return out, sc.Err()
}

// Window returns the requests from the start-th on, at most n of them
// (0: no limit) and those arriving within d of the first (0: no limit),
// with their arrival times counted from the first. The result shares
// reqs' block slices.
func Window(reqs []Request, start, n int, d time.Duration) []Request {
	if start >= len(reqs) {
		return nil
	}
	reqs = reqs[start:]
	if n > 0 && n < len(reqs) {
		reqs = reqs[:n]
	}
	out := make([]Request, 0, len(reqs))
	t0 := reqs[0].At
	for _, r := range reqs {
		if d > 0 && r.At-t0 > d {
			break
		}
		r.At -= t0
		out = append(out, r)
	}
	return out
}

// Span is the time from the first arrival of reqs to the last.
func Span(reqs []Request) time.Duration {
	if len(reqs) == 0 {
		return 0
	}
	return reqs[len(reqs)-1].At - reqs[0].At
}
