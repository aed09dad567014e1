package router

import (
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{"Connection", true},
		{"connection", true},
		{"KEEP-ALIVE", true}, // the same length as Connection
		{"Te", true},
		{"tE", true},
		{"X-Forwarded-For", true},
		{"Proxy-Authorization", true},
		{"Content-Type", false},
		{"Connectiom", false}, // a length in the set, not a name in it
		{"Connections", false},
		{"Hos", false},
		{"", false},
		{strings.Repeat("x", 200), false},
	} {
		if got := hopByHop.has([]byte(tc.key)); got != tc.want {
			t.Errorf("hopByHop.has(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
	if n := len(hopByHop.list); n != 13 {
		t.Errorf("hopByHop lists %d names, want 13", n)
	}
	if !credentials.has([]byte("x-api-key")) || credentials.has([]byte("X-Api-Keys")) {
		t.Error("credentials: X-Api-Key is one, X-Api-Keys is not")
	}
}
