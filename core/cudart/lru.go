package cudart

// lru is a fixed-capacity map that forgets its least recently used entry when full. Its
// slots are allocated once, so hits, replacements and evictions allocate nothing; the
// GEMM plan cache and the CUDA-graph cache are built on it.
type lru[K comparable, V any] struct {
	idx        map[K]int32
	keys       []K
	vals       []V
	prev, next []int32 // recency list through the slots; -1 ends it
	head, tail int32   // most and least recently used slot, -1 when empty
	n          int
}

func newLRU[K comparable, V any](capacity int) *lru[K, V] {
	return &lru[K, V]{
		idx:  make(map[K]int32, capacity),
		keys: make([]K, capacity), vals: make([]V, capacity),
		prev: make([]int32, capacity), next: make([]int32, capacity),
		head: -1, tail: -1,
	}
}

func (l *lru[K, V]) len() int { return l.n }
func (l *lru[K, V]) cap() int { return len(l.keys) }

// get returns the value under k and marks it most recently used.
func (l *lru[K, V]) get(k K) (V, bool) {
	i, ok := l.idx[k]
	if !ok {
		var zero V
		return zero, false
	}
	l.touch(i)
	return l.vals[i], true
}

// put stores v under k as the most recently used entry. When that displaces a value (the
// old value under k, or the least recently used entry of a full cache) it returns the
// displaced key and value so the caller can release them.
func (l *lru[K, V]) put(k K, v V) (oldK K, oldV V, displaced bool) {
	if i, ok := l.idx[k]; ok {
		oldK, oldV = l.keys[i], l.vals[i]
		l.vals[i] = v
		l.touch(i)
		return oldK, oldV, true
	}
	var i int32
	if l.n < len(l.keys) {
		i = int32(l.n)
		l.n++
	} else {
		i = l.tail
		oldK, oldV, displaced = l.keys[i], l.vals[i], true
		delete(l.idx, oldK)
		l.unlink(i)
	}
	l.keys[i], l.vals[i] = k, v
	l.idx[k] = i
	l.pushFront(i)
	return oldK, oldV, displaced
}

// remove deletes k, returning its value.
func (l *lru[K, V]) remove(k K) (V, bool) {
	i, ok := l.idx[k]
	if !ok {
		var zero V
		return zero, false
	}
	v := l.vals[i]
	delete(l.idx, k)
	l.unlink(i)
	// Move the last used slot into the hole, so slots [0, n) stay the live ones.
	last := int32(l.n - 1)
	if i != last {
		l.keys[i], l.vals[i] = l.keys[last], l.vals[last]
		l.idx[l.keys[i]] = i
		l.prev[i], l.next[i] = l.prev[last], l.next[last]
		if p := l.prev[i]; p >= 0 {
			l.next[p] = i
		} else {
			l.head = i
		}
		if n := l.next[i]; n >= 0 {
			l.prev[n] = i
		} else {
			l.tail = i
		}
	}
	var zk K
	var zv V
	l.keys[last], l.vals[last] = zk, zv
	l.n--
	return v, true
}

// each calls fn on every entry, most recently used first.
func (l *lru[K, V]) each(fn func(K, V)) {
	for i := l.head; i >= 0; i = l.next[i] {
		fn(l.keys[i], l.vals[i])
	}
}

// clear forgets every entry.
func (l *lru[K, V]) clear() {
	var zk K
	var zv V
	for i := 0; i < l.n; i++ {
		l.keys[i], l.vals[i] = zk, zv
	}
	clear(l.idx)
	l.n, l.head, l.tail = 0, -1, -1
}

func (l *lru[K, V]) touch(i int32) {
	if l.head == i {
		return
	}
	l.unlink(i)
	l.pushFront(i)
}

func (l *lru[K, V]) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
}

func (l *lru[K, V]) pushFront(i int32) {
	l.prev[i], l.next[i] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}
