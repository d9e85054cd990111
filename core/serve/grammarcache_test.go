package serve

import (
	"runtime"
	"testing"
	"weak"
)

// TestGrammarCacheDiesWithServer: a Server that compiled a grammar can be collected, and
// its cache entry goes with it (the cache was a global map holding every Server forever).
func TestGrammarCacheDiesWithServer(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	collected := make(chan struct{})
	var key weak.Pointer[Server]
	func() {
		s := &Server{eng: h.eng, tok: h.tok}
		key = weak.Make(s)
		if _, err := s.grammars(); err != nil {
			t.Fatal(err)
		}
		runtime.AddCleanup(s, func(ch chan struct{}) { close(ch) }, collected)
	}()
	for range 50 {
		runtime.GC()
		select {
		case <-collected:
			for range 50 {
				if _, ok := grammarCaches.Load(key); !ok {
					return
				}
				runtime.GC()
				runtime.Gosched()
			}
			t.Fatal("the collected Server's grammar cache entry is still there")
		default:
			runtime.Gosched()
		}
	}
	t.Fatal("a Server that compiled a grammar is never collected")
}
