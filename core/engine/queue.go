package engine

import "slices"

// queue is the waiting queue: a slice with a movable head, so that popping the front and
// pushing a preempted request back to the front are cheap. Removing a request from the
// middle (Abort, Stop, a cancelled context) is O(1): the request is marked as no longer
// queued and stays in the slice as a tombstone, which front and popFront skip; the slice
// is compacted once tombstones outnumber the queued requests, so removals cost O(1)
// amortised and a wave of cancellations under overload stays linear.
type queue struct {
	items []*request
	head  int
	n     int // queued requests (items[head:] less the tombstones)
	dead  int // tombstones in items[head:]
}

func (q *queue) len() int { return q.n }

// skipDead drops the tombstones at the head.
func (q *queue) skipDead() {
	for q.head < len(q.items) && !q.items[q.head].queued {
		q.items[q.head] = nil
		q.head++
		q.dead--
	}
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
}

func (q *queue) front() *request {
	q.skipDead()
	return q.items[q.head]
}

func (q *queue) popFront() *request {
	q.skipDead()
	r := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	r.queued = false
	q.n--
	return r
}

func (q *queue) pushBack(r *request) {
	if q.head > 0 && q.head >= len(q.items)/2 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, r)
	q.added(r)
}

func (q *queue) pushFront(r *request) {
	q.added(r)
	if q.head > 0 {
		q.head--
		q.items[q.head] = r
		return
	}
	q.items = slices.Insert(q.items, 0, r)
}

func (q *queue) added(r *request) {
	r.queued = true
	q.n++
}

// insertSorted places r after every request that sorts before or equal to it by
// (priority, arrival order). Tombstones keep their keys, so the slice stays sorted.
func (q *queue) insertSorted(r *request) {
	live := q.items[q.head:]
	i, _ := slices.BinarySearchFunc(live, r, func(a, b *request) int {
		if a.priority != b.priority {
			if a.priority < b.priority {
				return -1
			}
			return 1
		}
		if a.order <= b.order {
			return -1
		}
		return 1
	})
	q.items = slices.Insert(q.items, q.head+i, r)
	q.added(r)
}

// remove takes r out of the queue in O(1) (amortised): it becomes a tombstone.
func (q *queue) remove(r *request) bool {
	if !r.queued {
		return false
	}
	r.queued = false
	q.n--
	q.dead++
	if q.dead > 64 && q.dead > q.n {
		q.compact()
	}
	return true
}

// compact drops every tombstone, keeping the queued requests in order.
func (q *queue) compact() {
	live := q.items[:0]
	for _, r := range q.items[q.head:] {
		if r.queued {
			live = append(live, r)
		}
	}
	clear(q.items[len(live):])
	q.items, q.head, q.dead = live, 0, 0
}
