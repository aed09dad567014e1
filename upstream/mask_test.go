package upstream

import (
	"fmt"
	"testing"
)

// A mask holds any of MaxReplicas slots, and Nth walks them in order
// across its words.
func TestMask(t *testing.T) {
	var m Mask
	slots := []int{0, 63, 64, 130, 200, MaxReplicas - 1}
	for _, i := range slots {
		m.Add(i)
	}
	if m.Len() != len(slots) || m.Empty() {
		t.Fatalf("Len %d", m.Len())
	}
	for k, want := range append(slots, slots[0]) { // Nth wraps around
		if got := m.Nth(uint64(k)); got != want {
			t.Errorf("Nth(%d) = %d, want %d", k, got, want)
		}
	}
	var o Mask
	o.Add(64)
	o.Add(131)
	if a := m.And(o); a.Len() != 1 || !a.Has(64) {
		t.Errorf("And: %v", a)
	}
	if a := m.AndNot(o); a.Len() != len(slots)-1 || a.Has(64) {
		t.Errorf("AndNot: %v", a)
	}
	if a := m.Or(o); a.Len() != len(slots)+1 || !a.Has(131) {
		t.Errorf("Or: %v", a)
	}
	var empty Mask
	if empty.Nth(3) != -1 || !empty.Empty() {
		t.Error("empty mask")
	}
	var seen []int
	m.Each(func(i int) { seen = append(seen, i) })
	if fmt.Sprint(seen) != fmt.Sprint(slots) {
		t.Errorf("Each: %v", seen)
	}
}

// A set holds MaxReplicas replicas, all live, and no more.
func TestSetHoldsMaxReplicas(t *testing.T) {
	var urls []string
	for i := 0; i < MaxReplicas; i++ {
		urls = append(urls, fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1))
	}
	s, err := NewSet(urls, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if live := s.LiveMask(); live.Len() != MaxReplicas {
		t.Fatalf("%d live, want %d", live.Len(), MaxReplicas)
	}
	if _, err := s.Add("10.9.9.9:8000", Live); err == nil {
		t.Fatal("a replica past MaxReplicas was added")
	}
	if _, err := NewSet(append(urls, "10.9.9.9:8000"), Config{}); err == nil {
		t.Fatal("NewSet took more than MaxReplicas")
	}
}
