package shareddata

import "testing"

// TestCASRules: Envoy's rules for proxy_set_shared_data, table-driven on one store (one
// counter for the whole store, so the values of different keys never repeat).
func TestCASRules(t *testing.T) {
	s := New()
	if !s.Set("a", []byte("1"), 0) {
		t.Fatal("first set refused")
	}
	_, cas1, _ := s.Get("a")
	if !s.Set("b", []byte("2"), 0) {
		t.Fatal("set b refused")
	}
	_, casB, _ := s.Get("b")
	if casB == cas1 {
		t.Errorf("cas values repeat across keys (%d): Envoy uses one counter for the store", casB)
	}
	for _, tt := range []struct {
		name string
		key  string
		cas  uint32
		want bool
	}{
		{"matching cas", "a", cas1, true},
		{"same cas again is stale", "a", cas1, false},
		{"zero cas always wins", "a", 0, true},
		{"missing key ignores cas", "c", 99, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.Set(tt.key, []byte("v"), tt.cas); got != tt.want {
				t.Fatalf("Set(%q, cas %d) = %v, want %v", tt.key, tt.cas, got, tt.want)
			}
		})
	}
	if _, _, ok := s.Get("nope"); ok {
		t.Error("Get of a missing key reported ok")
	}
}

func TestCasCounterSkipsZero(t *testing.T) {
	s := New()
	s.cas = ^uint32(0)
	s.Set("a", nil, 0)
	s.Set("a", nil, 0)
	if _, cas, _ := s.Get("a"); cas != 1 {
		t.Fatalf("cas after wrap-around = %d, want 1 (0 is never a cas value)", cas)
	}
}

// TestStoreOwnsItsMemory: the store copies keys and values in (a caller reuses its
// buffers) and copies values out, and counts the payload a real host would keep.
func TestStoreOwnsItsMemory(t *testing.T) {
	s := New()
	key := []byte("slot-1")
	val := []byte("value")
	s.Set(string(key), val, 0)
	copy(key, "slot-2")
	copy(val, "XXXXX")
	got, _, ok := s.Get("slot-1")
	if !ok || string(got) != "value" {
		t.Fatalf("Get(slot-1) = %q, %v: the store must keep its own copies", got, ok)
	}
	got[0] = 'Y'
	if again, _, _ := s.Get("slot-1"); string(again) != "value" {
		t.Errorf("a value read out changed the store: %q", again)
	}
	buf, _, _ := s.AppendGet([]byte("pre:"), "slot-1")
	if string(buf) != "pre:value" {
		t.Errorf("AppendGet = %q", buf)
	}
	s.Set("slot-1", []byte("v2"), 0)
	if s.Keys() != 1 || s.Bytes() != len("slot-1")+len("v2") {
		t.Errorf("Keys %d Bytes %d, want 1 and %d", s.Keys(), s.Bytes(), len("slot-1")+len("v2"))
	}
	n := 0
	s.Range(func(k string, v []byte, cas uint32) {
		n++
		if k != "slot-1" || string(v) != "v2" || cas == 0 {
			t.Errorf("Range gave %q=%q cas %d", k, v, cas)
		}
	})
	if n != 1 {
		t.Errorf("Range visited %d entries, want 1", n)
	}
}
