package cudart

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// TestLRUAgainstModel drives the lru with random operations and compares it after each
// one with a plain slice kept in recency order.
func TestLRUAgainstModel(t *testing.T) {
	type kv struct{ k, v int }
	r := rand.New(rand.NewPCG(1, 2))
	for _, capacity := range []int{1, 2, 5} {
		l := newLRU[int, int](capacity)
		var model []kv // most recent first
		find := func(k int) int {
			return slices.IndexFunc(model, func(e kv) bool { return e.k == k })
		}
		for step := 0; step < 2000; step++ {
			k := r.IntN(8)
			switch op := r.IntN(4); op {
			case 0, 1: // put
				v := r.IntN(1000)
				oldK, oldV, displaced := l.put(k, v)
				var want *kv
				if i := find(k); i >= 0 {
					want = &kv{k, model[i].v}
					model = slices.Delete(model, i, i+1)
				} else if len(model) == capacity {
					want = &model[len(model)-1]
					model = model[:len(model)-1]
				}
				if displaced != (want != nil) || (want != nil && (oldK != want.k || oldV != want.v)) {
					t.Fatalf("cap %d step %d: put(%d) displaced (%d,%d,%v), want %+v", capacity, step, k, oldK, oldV, displaced, want)
				}
				model = slices.Insert(model, 0, kv{k, v})
			case 2: // get
				v, ok := l.get(k)
				i := find(k)
				if ok != (i >= 0) || (ok && v != model[i].v) {
					t.Fatalf("cap %d step %d: get(%d) = %d,%v; model %v", capacity, step, k, v, ok, model)
				}
				if ok {
					e := model[i]
					model = slices.Insert(slices.Delete(model, i, i+1), 0, e)
				}
			case 3: // remove
				v, ok := l.remove(k)
				i := find(k)
				if ok != (i >= 0) || (ok && v != model[i].v) {
					t.Fatalf("cap %d step %d: remove(%d) = %d,%v; model %v", capacity, step, k, v, ok, model)
				}
				if ok {
					model = slices.Delete(model, i, i+1)
				}
			}
			var got []kv
			l.each(func(k, v int) { got = append(got, kv{k, v}) })
			if !reflect.DeepEqual(got, model) && !(len(got) == 0 && len(model) == 0) {
				t.Fatalf("cap %d step %d: order %v, want %v", capacity, step, got, model)
			}
			if l.len() != len(model) {
				t.Fatalf("len %d, want %d", l.len(), len(model))
			}
		}
	}
}

// fakeGraphs stands in for the driver's capture and destroy.
type fakeGraphs struct {
	next      uintptr
	destroyed []uintptr
	failWith  error
}

func (f *fakeGraphs) install(g *GraphCache) {
	g.capture = func(c *Ctx, s *Stream, fn func() error) (*GraphExec, error) {
		if err := fn(); err != nil {
			return nil, err
		}
		if f.failWith != nil {
			return nil, f.failWith
		}
		f.next++
		return &GraphExec{h: f.next}, nil
	}
	g.destroy = func(c *Ctx, e *GraphExec) error {
		f.destroyed = append(f.destroyed, e.h)
		e.h = 0
		return nil
	}
}

func TestGraphCacheEviction(t *testing.T) {
	if _, err := NewGraphCache(0); err == nil {
		t.Fatal("a cache of 0 graphs was accepted")
	}
	g, err := NewGraphCache(3)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeGraphs{}
	f.install(g)
	c := &Ctx{api: fakeDriver(t)}
	s := &Stream{h: 9}
	dec := func(b int) GraphKey { return GraphKey{Kind: GraphDecode, Bucket: b} }
	pre := GraphKey{Kind: GraphPrefill, Bucket: 512}
	ran := 0
	for _, k := range []GraphKey{dec(1), dec(8), pre} {
		if _, err := g.Capture(c, s, k, func() error { ran++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if ran != 3 || g.Len() != 3 || len(f.destroyed) != 0 {
		t.Fatalf("after 3 captures: ran %d, len %d, destroyed %v", ran, g.Len(), f.destroyed)
	}
	// Replaying decode/1 makes decode/8 the least recently used, so it goes next.
	if ok, err := g.Replay(c, s, dec(1)); !ok || err != nil {
		t.Fatalf("replay decode/1 = %v, %v", ok, err)
	}
	if _, err := g.Capture(c, s, dec(32), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.destroyed, []uintptr{2}) || g.Evicted() != 1 {
		t.Fatalf("destroyed %v (evicted %d), want decode/8's graph 2", f.destroyed, g.Evicted())
	}
	want := []GraphKey{dec(32), dec(1), pre}
	if got := g.Keys(); !slices.Equal(got, want) {
		t.Fatalf("keys %v, want %v", got, want)
	}
	if ok, err := g.Replay(c, s, dec(8)); ok || err != nil {
		t.Fatalf("replay of an evicted graph = %v, %v; want a miss", ok, err)
	}
	// Re-capturing a key replaces its graph and destroys the old one, evicting nothing.
	if _, err := g.Capture(c, s, pre, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.destroyed, []uintptr{2, 3}) || g.Evicted() != 1 || g.Len() != 3 {
		t.Fatalf("after re-capture: destroyed %v, evicted %d, len %d", f.destroyed, g.Evicted(), g.Len())
	}
	// A failing step stores nothing and names the key.
	boom := errors.New("kernel refused")
	if _, err := g.Capture(c, s, dec(64), func() error { return boom }); !errors.Is(err, boom) || g.Len() != 3 {
		t.Fatalf("failed capture: %v, len %d", err, g.Len())
	} else if got := err.Error(); got != "graph decode/64: kernel refused" {
		t.Fatalf("error text %q", got)
	}
	if err := g.Drop(c, dec(1)); err != nil || g.Len() != 2 {
		t.Fatalf("drop: %v, len %d", err, g.Len())
	}
	if err := g.Close(c); err != nil || g.Len() != 0 || len(f.destroyed) != 5 {
		t.Fatalf("close: %v, len %d, destroyed %v", err, g.Len(), f.destroyed)
	}
}

func TestGraphReplayAllocationFree(t *testing.T) {
	g, _ := NewGraphCache(8)
	f := &fakeGraphs{}
	f.install(g)
	c := &Ctx{api: fakeDriver(t)}
	s := &Stream{h: 9}
	for _, b := range []int{1, 2, 4, 8, 16, 32, 64, 128} {
		g.Capture(c, s, GraphKey{Kind: GraphDecode, Bucket: b}, func() error { return nil })
	}
	buckets := []int{1, 2, 4, 8, 16, 32, 64, 128}
	batch := 0
	n := testing.AllocsPerRun(1000, func() {
		batch = batch%100 + 1
		b, ok := engine.PickBucket(buckets, batch)
		if !ok {
			t.Fatal("no bucket")
		}
		if hit, err := g.Replay(c, s, GraphKey{Kind: GraphDecode, Bucket: b}); !hit || err != nil {
			t.Fatal(hit, err)
		}
	})
	if n != 0 {
		t.Fatalf("bucket choice and replay allocate %v times per step", n)
	}
}

// BenchmarkGraphReplayHostSide measures the host's share of a decode step's replay: bucket
// choice, cache lookup and the cuGraphLaunch call (to a stand-in symbol).
func BenchmarkGraphReplayHostSide(b *testing.B) {
	g, _ := NewGraphCache(16)
	f := &fakeGraphs{}
	f.install(g)
	c := &Ctx{api: fakeDriver(b)}
	s := &Stream{h: 9}
	buckets := []int{1, 2, 4, 8, 16, 32, 64, 128, 256}
	for _, bk := range buckets {
		g.Capture(c, s, GraphKey{Kind: GraphDecode, Bucket: bk}, func() error { return nil })
	}
	batch := 0
	b.ReportAllocs()
	for b.Loop() {
		batch = batch%256 + 1
		bk, _ := engine.PickBucket(buckets, batch)
		g.Replay(c, s, GraphKey{Kind: GraphDecode, Bucket: bk})
	}
}
