// Package dist is Resin's communicator: the collectives that tensor, expert, data and
// context parallelism need between the ranks of one model, behind one interface with
// three implementations.
//
//   - NewInProcess: ranks that are goroutines of one process, for tests and for a CPU
//     runner that splits one model across its own threads.
//   - JoinShm: processes of one host exchanging messages through an mmap'ed file under
//     /dev/shm (or os.TempDir): one slot pair per rank, sequence-numbered, published with
//     atomic stores and polled with backoff. No cgo.
//   - NewNCCL: GPUs through core/cudart's NCCL binding; host buffers are staged through
//     device memory.
//
// Every collective is defined by an exchange of byte messages in which each rank sees
// every rank's message; reductions then sum in rank order 0, 1, …, n-1 in float32 (bf16
// rounded once at the end), so every rank gets the same bits and two runs agree bit for
// bit. Every wait has a deadline (Options.Timeout): a peer that died, exited or never
// joined is an error naming its rank (a *PeerError), never a hang.
package dist
