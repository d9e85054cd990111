package engine

import "slices"

// queue is the waiting queue: a slice with a movable head, so that popping the front and
// pushing a preempted request back to the front are cheap.
type queue struct {
	items []*request
	head  int
}

func (q *queue) len() int { return len(q.items) - q.head }

func (q *queue) front() *request { return q.items[q.head] }

func (q *queue) popFront() *request {
	r := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return r
}

func (q *queue) pushBack(r *request) {
	if q.head > 0 && q.head >= len(q.items)/2 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, r)
}

func (q *queue) pushFront(r *request) {
	if q.head > 0 {
		q.head--
		q.items[q.head] = r
		return
	}
	q.items = slices.Insert(q.items, 0, r)
}

// insertSorted places r after every request that sorts before or equal to it by
// (priority, arrival order).
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
}

func (q *queue) remove(r *request) bool {
	for i := q.head; i < len(q.items); i++ {
		if q.items[i] == r {
			q.items = slices.Delete(q.items, i, i+1)
			return true
		}
	}
	return false
}
