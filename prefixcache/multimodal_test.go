package prefixcache

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Multimodal requests: images and audio are content parts whose bytes (an
// inline data: URL, base64 data) or URL are part of the prompt. An image
// spelled differently in JSON is the same image; an image that differs by
// one byte is another prompt from its message on.

// b64 returns n random bytes in standard base64, which has '/' and '+'.
func b64(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 0))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)
}

// flip changes the base64 character in the middle of s.
func flip(s string) string {
	i := len(s) / 2
	c := byte('A')
	if s[i] == 'A' {
		c = 'B'
	}
	return s[:i] + string(c) + s[i+1:]
}

// escapeSlashes spells each '/' as "\/", as PHP's json_encode does, and
// the first 'A' as \u0041.
func escapeSlashes(s string) string {
	return strings.Replace(strings.ReplaceAll(s, "/", `\/`), "A", `\u0041`, 1)
}

type chatImages struct {
	url, png, wav string
}

// body is a chat conversation with an image by URL (message 1), an inline
// image (3) and inline audio (5), among text messages. respell spells
// every part differently: key order, whitespace, escapes.
func (c chatImages) body(respell bool) string {
	img1 := `{"type":"image_url","image_url":{"url":"` + c.url + `"}}`
	img2 := `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + c.png + `","detail":"high"}}`
	audio := `{"type":"input_audio","input_audio":{"data":"` + c.wav + `","format":"wav"}}`
	if respell {
		img1 = "{ \"image_url\" : {\n\t\"url\" : \"" + escapeSlashes(c.url) + "\"\n},\n \"type\":\"image_url\" }"
		img2 = `{"image_url":{"detail":"high","url":"data:image\/png;base64,` + escapeSlashes(c.png) + `"},"type":"image_url"}`
		audio = `{"input_audio" : {"format":"wav",  "data":"` + escapeSlashes(c.wav) + `"}, "type" : "input_audio"}`
	}
	return `{"model":"qwen-vl","messages":[
{"role":"system","content":"You see images and hear sounds."},
{"role":"user","content":[{"type":"text","text":"What is in this picture?"},` + img1 + `]},
{"role":"assistant","content":"A cat."},
{"role":"user","content":[{"type":"text","text":"And in this one?"},` + img2 + `]},
{"role":"assistant","content":"A dog."},
{"role":"user","content":[{"type":"text","text":"Listen:"},` + audio + `]},
{"role":"assistant","content":"Barking."},
{"role":"user","content":"Thanks."}]}`
}

type anthropicImages struct{ png, jpeg string }

// body is an Anthropic Messages conversation with an inline PNG (message
// 0) and JPEG (2).
func (a anthropicImages) body(respell bool) string {
	img1 := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + a.png + `"}}`
	img2 := `{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"` + a.jpeg + `"}}`
	if respell {
		img1 = `{"source":{"data":"` + escapeSlashes(a.png) + `","media_type":"image\/png","type":"base64"},"type":"image"}`
		img2 = "{\"type\": \"image\",\n \"source\": {\"type\": \"base64\", \"media_type\": \"image/jpeg\", \"data\": \"" + escapeSlashes(a.jpeg) +
			"\"}, \"cache_control\": {\"type\": \"ephemeral\"}}"
	}
	return `{"model":"claude","max_tokens":64,"system":[{"type":"text","text":"You see images."}],"messages":[
{"role":"user","content":[` + img1 + `,{"type":"text","text":"What is this?"}]},
{"role":"assistant","content":[{"type":"text","text":"A cat."}]},
{"role":"user","content":[` + img2 + `,{"type":"text","text":"And this?"}]},
{"role":"assistant","content":"A dog."},
{"role":"user","content":"Thanks."}]}`
}

// sameUpTo checks that a and b agree on links before first and differ on
// every link from first on.
func sameUpTo(t *testing.T, name string, a, b []Link, first int) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d links against %d", name, len(a), len(b))
	}
	for i := range a {
		if same := a[i] == b[i]; same != (i < first) {
			t.Errorf("%s: link %d same=%v, want links 0..%d the same and the rest different", name, i, same, first-1)
		}
	}
}

func TestMultimodalChat(t *testing.T) {
	c := chatImages{url: "https://example.com/images/cat-2048x1536.png?sig=ab/cd+ef", png: b64(1, 3000), wav: b64(2, 5000)}
	base := chainOf(t, c.body(false))
	if len(base) != 8 {
		t.Fatalf("%d links, want 8", len(base))
	}
	sameUpTo(t, "the same images spelled differently", base, chainOf(t, c.body(true)), len(base))

	for _, tc := range []struct {
		name   string
		change func(*chatImages)
		first  int
	}{
		{"image URL", func(c *chatImages) { c.url = strings.Replace(c.url, "cat", "cab", 1) }, 1},
		{"image URL query", func(c *chatImages) { c.url = strings.Replace(c.url, "ab/cd", "ab/cD", 1) }, 1},
		{"inline image, one byte", func(c *chatImages) { c.png = flip(c.png) }, 3},
		{"inline image, last byte", func(c *chatImages) { c.png = c.png[:len(c.png)-2] + "x=" }, 3},
		{"inline audio, one byte", func(c *chatImages) { c.wav = flip(c.wav) }, 5},
	} {
		d := c
		tc.change(&d)
		sameUpTo(t, tc.name, base, chainOf(t, d.body(false)), tc.first)
		sameUpTo(t, tc.name+", respelled", base, chainOf(t, d.body(true)), tc.first)
	}
}

func TestMultimodalAnthropic(t *testing.T) {
	a := anthropicImages{png: b64(3, 3000), jpeg: b64(4, 7000)}
	base := chainOf(t, a.body(false))
	if len(base) != 5 {
		t.Fatalf("%d links, want 5", len(base))
	}
	sameUpTo(t, "the same images spelled differently", base, chainOf(t, a.body(true)), len(base))

	d := a
	d.png = flip(d.png)
	sameUpTo(t, "first image, one byte", base, chainOf(t, d.body(false)), 0)
	d = a
	d.jpeg = flip(d.jpeg)
	sameUpTo(t, "second image, one byte", base, chainOf(t, d.body(false)), 2)
	sameUpTo(t, "second image, one byte, respelled", base, chainOf(t, d.body(true)), 2)
	sameUpTo(t, "second image's media type", base,
		chainOf(t, strings.Replace(a.body(false), "image/jpeg", "image/webp", 1)), 2)
}

// A 1 MB inline image (and the same image with its slashes escaped, an
// escape every 64 bytes or so) is read without allocating, and both
// spellings make one chain.
func TestMultimodalLargeImage(t *testing.T) {
	c := chatImages{url: "https://example.com/a.png", png: b64(5, 3<<18), wav: b64(6, 1000)} // 1 MiB of base64
	plain, escaped := []byte(c.body(false)), []byte(c.body(true))
	if len(plain) < 1<<20 {
		t.Fatalf("body of %d bytes", len(plain))
	}
	want := chainOf(t, string(plain))
	var ch Chains
	for name, body := range map[string][]byte{"plain": plain, "escaped": escaped} {
		err := ch.Read(body, DefaultPromptChunk) // grows the chains once
		if n := testing.AllocsPerRun(10, func() {
			err = ch.Read(body, DefaultPromptChunk)
		}); n != 0 {
			t.Errorf("%s: Read allocates %.1f times per call on a 1 MB image, want 0", name, n)
		}
		if err != nil || fmt.Sprint(ch.Messages) != fmt.Sprint(want) {
			t.Errorf("%s: %v, chain %x, want %x", name, err, ch.Messages, want)
		}
	}
}
