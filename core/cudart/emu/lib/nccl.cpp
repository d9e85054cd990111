// nccl.cpp: the emulated NCCL, the calls core/cudart binds (nccl.go). Ranks whose
// communicator lives in one process (one rank per device thread) meet in a Group: a
// collective blocks its rank's thread until every rank has queued it, then the last to
// arrive computes it for all (in rank order, so sums are reproducible) and releases the
// others. Ranks in different processes (a --tp-procs worker each) meet in a shared-memory
// segment named after the unique id (Shm below): each rank copies its part into its own
// slot, and once every rank's has arrived each computes the result from the slots in rank
// order, the same sums the Group computes, so the results are bit-identical; their
// point-to-point messages (ncclSend, ncclRecv) are files beside the segment. A rank
// waiting for a peer that exited, or that does not arrive within RESIN_EMU_NCCL_TIMEOUT
// seconds (default 300; in either kind of group), fails the collective with
// ncclSystemError and a message naming the rank, instead of hanging. With one rank a
// collective is a copy.
//
// Real NCCL does neither: a collective whose peer died or hangs waits for good, until a
// rank aborts its communicator (ncclCommAbort, which the watchdogs above NCCL call).
// RESIN_EMU_NCCL_HANG=1 makes the emulation wait the same way (no deadline, no watch on
// the peers' processes: only an abort ends the wait), and RESIN_EMU_NCCL_STALL_RANK=r
// makes rank r's first collective never arrive (it waits until its own communicator is
// aborted or its process killed): a rank that hangs mid-step, for the watchdogs' tests
// (with RESIN_EMU_NCCL_STALL_MARK=path, the stall creates that file first).
// ncclCommAbort ends every wait of its rank at once with an error, and, for ranks of one
// process, the others' waits too; the aborted communicator's memory is kept (a thread may
// still be inside one of its calls), and ncclCommDestroy must not follow it.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <random>

#include "emu_lib.h"

using resin_emu::Cfg;
using resin_emu::Config;
using resin_emu::DeviceRange;
using resin_emu::Mu;
using resin_emu::Op;
using resin_emu::Result;
using resin_emu::SetLaunchError;
using resin_emu::StreamCapturing;
using resin_emu::Submit;

namespace {

enum : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
};

struct UniqueID {
  char internal[128];
};

int typeSize(int t) {
  switch (t) {
    case 0: case 1: return 1;          // int8, uint8
    case 2: case 3: case 7: return 4;  // int32, uint32, float32
    case 4: case 5: case 8: return 8;  // int64, uint64, float64
    case 6: case 9: return 2;          // float16, bfloat16
  }
  return 0;
}

// Group is the shared state of one communicator: its ranks and the collective under way.
struct Group {
  int ranks = 0;
  int joined = 0;
  std::mutex mu;
  std::condition_variable cv;
  // The collective being gathered: each rank's buffers, then a generation count.
  std::vector<const void*> send;
  std::vector<void*> recv;
  int arrived = 0;
  unsigned long long gen = 0;
  std::string kind;
  size_t count = 0;
  int type = 0, op = 0;
  bool graph = false;    // the collective under way runs from a CUDA graph's replay
  std::vector<bool> in;  // which ranks have arrived at the collective under way
  // Why the group failed: a rank waited past RESIN_EMU_NCCL_TIMEOUT for the others. Every
  // collective fails with it since (the ranks are out of step), as NCCL's would after an
  // abort.
  std::string broken;
  // Point-to-point messages, by (from, to), in order.
  std::map<std::pair<int, int>, std::vector<std::vector<char>>> sends;
};

struct Shm;

struct Comm {
  std::shared_ptr<Group> g;  // ranks all in this process
  Shm* shm = nullptr;        // ranks in several processes
  size_t shm_bytes = 0;      // the mapping's length
  unsigned long long seq = 0;  // this rank's collectives through shm so far
  std::string broken;        // why the shm communicator failed (it is out of step since)
  std::string key;           // the unique id's name (the shm ranks' point-to-point files)
  // The shm ranks' point-to-point messages so far, by peer: sent to it, received from it.
  std::map<int, unsigned long long> sent, received;
  int rank = 0;
  int ranks = 0;
  std::atomic<bool> aborted{false};  // ncclCommAbort was called
  bool stalled = false;              // RESIN_EMU_NCCL_STALL_RANK's stall happened
};

// abortedError is the failure of a call on an aborted communicator.
std::string abortedError(const Comm* c) {
  return "emulated NCCL: rank " + std::to_string(c->rank) + "'s communicator was aborted (ncclCommAbort)";
}

// hangMode is RESIN_EMU_NCCL_HANG=1: waits as real NCCL's (see the top of the file).
bool hangMode() {
  const char* e = getenv("RESIN_EMU_NCCL_HANG");
  return e && e[0] == '1' && e[1] == 0;
}

// stall is RESIN_EMU_NCCL_STALL_RANK's hang of rank c's first collective: true (after
// the wait, which only an abort ends) when it applies.
bool stall(Comm* c) {
  const char* e = getenv("RESIN_EMU_NCCL_STALL_RANK");
  if (!e || !*e || c->stalled || atoi(e) != c->rank) return false;
  c->stalled = true;
  if (const char* mark = getenv("RESIN_EMU_NCCL_STALL_MARK")) {  // tells a test the stall began
    int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) close(fd);
  }
  while (!c->aborted.load(std::memory_order_acquire)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, nullptr);
  }
  return true;
}

// The last failure's detail on this thread, for ncclGetErrorString.
thread_local std::string tl_nccl_error;

int systemError(const std::string& msg) {
  tl_nccl_error = msg;
  SetLaunchError(msg);
  return kSystemError;
}

std::mutex g_mu;
std::map<std::string, std::shared_ptr<Group>> g_groups;  // by unique id
unsigned long long g_next_id = 1;

float toF(const void* p, int t, size_t i) {
  switch (t) {
    case 7: return ((const float*)p)[i];
    case 9: {
      uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
  }
  return 0;
}

void fromF(void* p, int t, size_t i, float v) {
  if (t == 7) {
    ((float*)p)[i] = v;
    return;
  }
  uint32_t u;
  memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    ((uint16_t*)p)[i] = (uint16_t)((u >> 16) | 0x40);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1);
  ((uint16_t*)p)[i] = (uint16_t)(u >> 16);
}

// reduce combines the ranks' send buffers element by element, in rank order, into out.
// Float32 and bfloat16 sum, max, min and average, in float32.
int reduce(const std::vector<const void*>& in, void* out, size_t count, int type, int op, size_t offset) {
  if (type != 7 && type != 9) return kInvalidArgument;
  if (op != 0 && op != 2 && op != 3 && op != 4) return kInvalidArgument;
  int n = (int)in.size();
  for (size_t i = 0; i < count; i++) {
    float acc = toF(in[0], type, offset + i);
    for (int r = 1; r < n; r++) {
      float v = toF(in[r], type, offset + i);
      if (op == 0 || op == 4) acc += v;
      if (op == 2) acc = acc > v ? acc : v;
      if (op == 3) acc = acc < v ? acc : v;
    }
    if (op == 4) acc /= (float)n;
    fromF(out, type, i, acc);
  }
  return kSuccess;
}

int shmCollective(Comm* c, const std::string& kind, const void* send, void* recv, size_t count, int type, int op, bool graph);
double timeoutSeconds();

// graphMismatch is why a collective that some ranks run from a CUDA graph and others
// eagerly fails: NCCL requires whether a launch is graph-captured to be uniform over its
// ranks (and a graph's replay to be collective for the ranks that captured it).
std::string graphMismatch(const std::string& kind, int rank, bool graph) {
  return "emulated NCCL: rank " + std::to_string(rank) + " ran " + kind + (graph ? " from a CUDA graph" : " eagerly") +
         " where another rank ran it " + (graph ? "eagerly" : "from a CUDA graph") +
         ": whether a launch is graph-captured must be uniform over the ranks (NCCL's rule for CUDA graphs); the communicator is broken";
}

// collective runs one collective of rank c (graph: from a CUDA graph's replay): it waits
// for every rank, and the last rank to arrive computes the results of all of them.
int collective(Comm* c, const std::string& kind, const void* send, void* recv, size_t count, int type, int op, bool graph) {
  if (c->aborted.load(std::memory_order_acquire) || stall(c)) return systemError(abortedError(c));
  if (c->shm) return shmCollective(c, kind, send, recv, count, type, op, graph);
  Group* g = c->g.get();
  size_t es = typeSize(type);
  if (es == 0) return kInvalidArgument;
  std::unique_lock<std::mutex> l(g->mu);
  if (!g->broken.empty()) return systemError(g->broken);
  if (g->arrived == 0) {
    g->kind = kind;
    g->count = count;
    g->type = type;
    g->op = op;
    g->graph = graph;
    g->send.assign(g->ranks, nullptr);
    g->recv.assign(g->ranks, nullptr);
    g->in.assign(g->ranks, false);
  } else if (g->kind != kind || g->count != count || g->type != type || g->op != op) {
    // The ranks called different collectives: they are out of step, and the ones waiting
    // learn why now rather than at the deadline.
    g->broken = "emulated NCCL: rank " + std::to_string(c->rank) + " called " + kind + " of " + std::to_string(count) +
                " where the others called " + g->kind + " of " + std::to_string(g->count) + "; the communicator is broken";
    g->cv.notify_all();
    return systemError(g->broken);
  } else if (g->graph != graph) {
    g->broken = graphMismatch(kind, c->rank, graph);
    g->cv.notify_all();
    return systemError(g->broken);
  }
  g->send[c->rank] = send;
  g->recv[c->rank] = recv;
  g->in[c->rank] = true;
  unsigned long long gen = g->gen;
  if (++g->arrived < g->ranks) {
    // A peer that never comes (its step failed before this collective, or it hangs)
    // fails the wait after the deadline, naming it, instead of hanging this rank.
    double secs = timeoutSeconds();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(secs));
    g->cv.wait_until(l, deadline, [&] { return g->gen != gen || !g->broken.empty(); });
    if (g->gen != gen) return kSuccess;
    if (g->broken.empty()) {
      std::string missing;
      for (int r = 0; r < g->ranks; r++)
        if (!g->in[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      char buf[64];
      snprintf(buf, sizeof buf, "%.0f", secs);
      g->broken = "emulated NCCL " + kind + " of rank " + std::to_string(c->rank) + ": rank(s) " + missing +
                  " did not arrive within " + buf + " s (RESIN_EMU_NCCL_TIMEOUT); the communicator is broken";
      g->cv.notify_all();
    }
    return systemError(g->broken);
  }
  int rc = kSuccess;
  int n = g->ranks;
  if (kind == "allreduce") {
    if (n == 1) {
      if (recv != send) memmove(recv, send, count * es);
    } else {
      std::vector<float> tmp;
      // Compute into a scratch first: recv may alias a send buffer another rank reads.
      std::unique_ptr<char[]> buf(new char[count * es]);
      rc = reduce(g->send, buf.get(), count, type, op, 0);
      for (int r = 0; r < n && rc == kSuccess; r++) memcpy(g->recv[r], buf.get(), count * es);
    }
  } else if (kind == "allgather") {
    std::unique_ptr<char[]> buf(new char[n * count * es]);
    for (int r = 0; r < n; r++) memcpy(buf.get() + r * count * es, g->send[r], count * es);
    for (int r = 0; r < n; r++) memcpy(g->recv[r], buf.get(), n * count * es);
  } else if (kind == "broadcast") {
    // op carries the root.
    if (op < 0 || op >= n) {
      rc = kInvalidArgument;
    } else {
      std::unique_ptr<char[]> buf(new char[count * es]);
      memcpy(buf.get(), g->send[op], count * es);
      for (int r = 0; r < n; r++) memcpy(g->recv[r], buf.get(), count * es);
    }
  } else if (kind == "reducescatter") {
    std::vector<std::unique_ptr<char[]>> outs;
    for (int r = 0; r < n && rc == kSuccess; r++) {
      outs.emplace_back(new char[count * es]);
      rc = reduce(g->send, outs.back().get(), count, type, op, r * count);
    }
    for (int r = 0; r < n && rc == kSuccess; r++) memcpy(g->recv[r], outs[r].get(), count * es);
  }
  g->arrived = 0;
  g->gen++;
  g->cv.notify_all();
  return rc;
}

// ---- ranks in several processes: a shared-memory segment per communicator ----
//
// The segment /dev/shm/<unique id> is created by the first rank to open it and mapped by
// the others (rank 0 unlinks the name once all have joined). Each rank owns a slot: its
// pid, two sequence counters and a data area. Collective number k of rank r writes its
// part (a chunk of at most the data area's bytes; longer collectives go in several
// chunks, each its own k) into slot r once every rank is done reading the slots of k−1,
// then publishes arrive=k; once every rank has arrived at k it reads all the slots,
// computes its own result in rank order and publishes done=k.

constexpr uint32_t kShmMagic = 0x4e43434cu;  // "NCCL"
constexpr size_t kShmHeader = 4096;
constexpr size_t kSlotHeader = 256;

enum Kind : int32_t { kAllReduce = 1, kAllGather = 2, kBroadcast = 3, kReduceScatter = 4 };

const char* kindName(int32_t k) {
  switch (k) {
    case kAllReduce: return "all-reduce";
    case kAllGather: return "all-gather";
    case kBroadcast: return "broadcast";
    case kReduceScatter: return "reduce-scatter";
  }
  return "collective";
}

int32_t kindCode(const std::string& kind) {
  if (kind == "allreduce") return kAllReduce;
  if (kind == "allgather") return kAllGather;
  if (kind == "broadcast") return kBroadcast;
  return kReduceScatter;
}

struct Shm {
  uint32_t magic;
  int32_t nranks;
  uint32_t joined;
  uint32_t pad;
  uint64_t data_bytes;  // each slot's data area
};

struct Slot {
  int32_t pid;
  int32_t kind, type, op;
  int32_t graph, pad_;  // the collective runs from a CUDA graph's replay (1) or eagerly (0)
  uint64_t arrive, done;
  uint64_t count, offset, n;  // the collective's count, and this chunk's offset and elements
};

size_t slotStride(uint64_t data_bytes) { return kSlotHeader + data_bytes; }

Slot* slotOf(Shm* s, int r) {
  return (Slot*)((char*)s + kShmHeader + (size_t)r * slotStride(s->data_bytes));
}

char* dataOf(Shm* s, int r) { return (char*)slotOf(s, r) + kSlotHeader; }

// peerPid is the process of rank peer of a communicator across processes.
int peerPid(const Comm* c, int peer) { return __atomic_load_n(&slotOf(c->shm, peer)->pid, __ATOMIC_ACQUIRE); }

double timeoutSeconds() {
  if (hangMode()) return 1e8;
  const char* e = getenv("RESIN_EMU_NCCL_TIMEOUT");
  if (e && *e) {
    double v = atof(e);
    if (v > 0) return v < 1e8 ? v : 1e8;  // beyond ~3 years: as good as none, and no overflow
  }
  return 300;
}

// chunkBytes is each slot's data area: RESIN_EMU_NCCL_CHUNK bytes (tests make it small to
// split collectives), else 4 MiB.
uint64_t chunkBytes() {
  const char* e = getenv("RESIN_EMU_NCCL_CHUNK");
  if (e && *e) {
    long long v = atoll(e);
    if (v >= 64) return (uint64_t)v;
  }
  return 4ull << 20;
}

// exited reports whether process pid has ended (gone, or a zombie its parent has not
// reaped yet).
bool exited(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return false;
  char buf[512];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

// waitFor waits until *word >= want: it spins a little, then yields, then sleeps (up to
// a millisecond), checking every few milliseconds whether c was aborted, whether process
// pid (the word's owner; 0: unknown yet) exited (not in hang mode) and whether the
// deadline passed. It returns "" or why it failed.
std::string waitFor(const Comm* c, const uint64_t* word, uint64_t want, int pid, double deadline_s, const std::string& what) {
  bool hang = hangMode();
  for (int i = 0; i < 256; i++) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return "";
  }
  auto start = std::chrono::steady_clock::now();
  auto last_check = start;
  long sleep_ns = 1000;
  for (int i = 0;; i++) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return "";
    if (i < 64) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, nullptr);
    sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
    auto now = std::chrono::steady_clock::now();
    if (now - last_check < std::chrono::milliseconds(5)) continue;
    last_check = now;
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) >= want) return "";
    if (c->aborted.load(std::memory_order_acquire)) return what + ": " + abortedError(c);
    if (!hang && exited(pid)) return what + ": the process exited (pid " + std::to_string(pid) + ")";
    double waited = std::chrono::duration<double>(now - start).count();
    if (waited > deadline_s) {
      char buf[64];
      snprintf(buf, sizeof buf, "%.0f", deadline_s);
      return what + ": not there within " + buf + " s (RESIN_EMU_NCCL_TIMEOUT)";
    }
  }
}

// shmJoin joins rank of nranks to the segment of key. It sets *local when every rank is
// in this process (the segment is then dropped: the ranks meet in a Group).
int shmJoin(Comm* c, const std::string& key, int nranks, int rank, bool* local) {
  *local = false;
  std::string path = "/dev/shm/" + key;
  uint64_t data = chunkBytes();
  size_t bytes = kShmHeader + (size_t)nranks * slotStride(data);
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return systemError("emulated NCCL: open " + path + ": " + strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || ((size_t)st.st_size < bytes && ftruncate(fd, bytes) != 0)) {
    int e = errno;
    close(fd);
    return systemError("emulated NCCL: size " + path + ": " + strerror(e));
  }
  if ((size_t)st.st_size > bytes) {
    close(fd);
    return kInvalidUsage;  // another rank's group has more ranks or bigger slots
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) return systemError("emulated NCCL: map " + path + ": " + strerror(e));
  Shm* s = (Shm*)p;
  // The first rank stamps the geometry; the others must agree with it.
  uint64_t zero64 = 0;
  __atomic_compare_exchange_n(&s->data_bytes, &zero64, data, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  int32_t zero = 0;
  __atomic_compare_exchange_n(&s->nranks, &zero, nranks, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  uint32_t zerou = 0;
  __atomic_compare_exchange_n(&s->magic, &zerou, kShmMagic, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  if (__atomic_load_n(&s->nranks, __ATOMIC_ACQUIRE) != nranks || __atomic_load_n(&s->data_bytes, __ATOMIC_ACQUIRE) != data ||
      __atomic_load_n(&s->magic, __ATOMIC_ACQUIRE) != kShmMagic) {
    munmap(p, bytes);
    return kInvalidUsage;
  }
  int32_t none = 0;
  if (!__atomic_compare_exchange_n(&slotOf(s, rank)->pid, &none, (int32_t)getpid(), false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    munmap(p, bytes);
    return kInvalidUsage;  // the rank joined twice
  }
  __atomic_add_fetch(&s->joined, 1, __ATOMIC_ACQ_REL);
  // Wait for the others: each registered rank's pid is watched, an unregistered one only
  // times out.
  double deadline = timeoutSeconds();
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (__atomic_load_n(&s->joined, __ATOMIC_ACQUIRE) >= (uint32_t)nranks) break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, nullptr);
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string missing;
    for (int r = 0; r < nranks; r++) {
      int pid = __atomic_load_n(&slotOf(s, r)->pid, __ATOMIC_ACQUIRE);
      if (pid != 0 && exited(pid)) {
        munmap(p, bytes);
        if (rank == 0) unlink(path.c_str());
        return systemError("emulated NCCL: ncclCommInitRank: rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                           ") exited before every rank joined");
      }
      if (pid == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (waited > deadline) {
      munmap(p, bytes);
      if (rank == 0) unlink(path.c_str());
      return systemError("emulated NCCL: ncclCommInitRank: rank(s) " + missing + " did not join " + key + " within " +
                         std::to_string((int)deadline) + " s (RESIN_EMU_NCCL_TIMEOUT)");
    }
  }
  if (rank == 0) unlink(path.c_str());  // every rank has it mapped
  bool all = true;
  for (int r = 0; r < nranks; r++) all = all && slotOf(s, r)->pid == (int32_t)getpid();
  if (all) {
    munmap(p, bytes);
    *local = true;
    return kSuccess;
  }
  c->shm = s;
  c->shm_bytes = bytes;
  return kSuccess;
}

// shmWait waits until every rank's counter (arrive, or done) reaches want.
int shmWait(Comm* c, bool arrive, uint64_t want, int32_t kind) {
  Shm* s = c->shm;
  for (int r = 0; r < c->ranks; r++) {
    if (r == c->rank) continue;
    Slot* sl = slotOf(s, r);
    std::string what = std::string("emulated NCCL ") + kindName(kind) + " #" + std::to_string(c->seq) + " of rank " +
                       std::to_string(c->rank) + ": waiting for rank " + std::to_string(r) +
                       (arrive ? " to arrive" : " to finish the previous collective");
    std::string err = waitFor(c, arrive ? &sl->arrive : &sl->done, want, sl->pid, timeoutSeconds(), what);
    if (!err.empty()) {
      c->broken = err;
      return systemError(err);
    }
  }
  return kSuccess;
}

// shmCollective is collective() for ranks in several processes.
int shmCollective(Comm* c, const std::string& kindStr, const void* send, void* recv, size_t count, int type, int op, bool graph) {
  if (!c->broken.empty()) return systemError(c->broken + " (the communicator failed before)");
  size_t es = typeSize(type);
  int n = c->ranks;
  int32_t kind = kindCode(kindStr);
  if (kind == kBroadcast && (op < 0 || op >= n)) return kInvalidArgument;
  Shm* s = c->shm;
  // Elements per chunk: a reduce-scatter's chunk takes that many of each rank's block.
  uint64_t per = s->data_bytes / (es * (kind == kReduceScatter ? n : 1));
  if (per == 0) return kInvalidArgument;
  const char* in = (const char*)send;
  char* out = (char*)recv;
  int rc = kSuccess;
  size_t off = 0;
  do {
    size_t m = count - off < per ? count - off : per;
    uint64_t k = ++c->seq;
    // Our slot is free once every rank has read the previous collective's.
    if ((rc = shmWait(c, false, k - 1, kind)) != kSuccess) return rc;
    Slot* mine = slotOf(s, c->rank);
    char* d = dataOf(s, c->rank);
    mine->kind = kind;
    mine->type = type;
    mine->op = op;
    mine->graph = graph ? 1 : 0;
    mine->count = count;
    mine->offset = off;
    mine->n = m;
    if (kind == kReduceScatter) {
      for (int b = 0; b < n; b++) memcpy(d + b * m * es, in + (b * count + off) * es, m * es);
    } else if (kind != kBroadcast || op == c->rank) {
      memcpy(d, in + off * es, m * es);
    }
    __atomic_store_n(&mine->arrive, k, __ATOMIC_RELEASE);
    if ((rc = shmWait(c, true, k, kind)) != kSuccess) return rc;
    for (int r = 0; r < n && rc == kSuccess; r++) {
      Slot* sl = slotOf(s, r);
      if (sl->kind != kind || sl->type != type || sl->op != op || sl->count != count || sl->offset != off) {
        c->broken = std::string("emulated NCCL: rank ") + std::to_string(r) + " called " + kindName(sl->kind) +
                    " where rank " + std::to_string(c->rank) + " called " + kindName(kind);
        rc = systemError(c->broken);  // the ranks called different collectives
      } else if (sl->graph != mine->graph) {
        c->broken = graphMismatch(kindStr, c->rank, graph);
        rc = systemError(c->broken);
      }
    }
    if (rc == kSuccess) {
      std::vector<const void*> parts(n);
      switch (kind) {
        case kAllReduce:
          for (int r = 0; r < n; r++) parts[r] = dataOf(s, r);
          rc = reduce(parts, out + off * es, m, type, op, 0);
          break;
        case kAllGather:
          for (int r = 0; r < n; r++) memcpy(out + (r * count + off) * es, dataOf(s, r), m * es);
          break;
        case kBroadcast:
          memcpy(out + off * es, dataOf(s, op), m * es);
          break;
        case kReduceScatter:
          for (int r = 0; r < n; r++) parts[r] = dataOf(s, r) + c->rank * m * es;
          rc = reduce(parts, out + off * es, m, type, op, 0);
          break;
      }
    }
    __atomic_store_n(&mine->done, k, __ATOMIC_RELEASE);
    off += m;
  } while (off < count && rc == kSuccess);
  return rc;
}

thread_local int tl_group_depth = 0;

}  // namespace

extern "C" int ncclGetVersion(int* v) {
  if (!v) return kInvalidArgument;
  *v = 22105;
  return kSuccess;
}

// ncclGetUniqueId names a communicator uniquely across the processes of this host: the
// pid, a counter and 64 random bits (the name of its shared-memory segment too).
extern "C" int ncclGetUniqueId(UniqueID* id) {
  if (!id) return kInvalidArgument;
  memset(id, 0, sizeof *id);
  static std::random_device rd;
  std::lock_guard<std::mutex> l(g_mu);
  unsigned long long rnd = ((unsigned long long)rd() << 32) ^ rd();
  snprintf(id->internal, sizeof id->internal, "resin-emu-nccl-%d-%llu-%016llx", (int)getpid(), g_next_id++, rnd);
  return kSuccess;
}

// ncclCommInitRank blocks until every rank has joined, as NCCL's does. The ranks first
// meet in the id's shared-memory segment; when they all turn out to be in this process
// they meet in a Group instead.
extern "C" int ncclCommInitRank(void** comm, int nranks, UniqueID id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return kInvalidArgument;
  std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
  if (key.rfind("resin-emu-nccl-", 0) != 0 || key.find('/') != std::string::npos) return kInvalidArgument;
  std::unique_ptr<Comm> c(new Comm());
  c->rank = rank;
  c->ranks = nranks;
  c->key = key;
  if (nranks > 1) {
    bool local = false;
    int rc = shmJoin(c.get(), key, nranks, rank, &local);
    if (rc != kSuccess) return rc;
    if (!local) {
      *comm = c.release();
      return kSuccess;
    }
  }
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto& slot = g_groups[key];
    if (!slot) {
      slot = std::make_shared<Group>();
      slot->ranks = nranks;
    }
    g = slot;
  }
  if (g->ranks != nranks) return kInvalidUsage;
  std::unique_lock<std::mutex> l(g->mu);
  g->joined++;
  if (g->joined > nranks) return kInvalidUsage;
  g->cv.notify_all();
  g->cv.wait(l, [&] { return g->joined >= nranks; });
  c->g = g;
  *comm = c.release();
  return kSuccess;
}

namespace {
// sweepMessages removes the point-to-point messages of shm rank c that nobody will read:
// those to it (a failed step's), and those from or to a rank whose process is gone (a
// killed worker's).
void sweepMessages(const Comm* c) {
  std::string prefix = c->key + "-p2p-";
  std::vector<bool> gone(c->ranks, false);
  for (int r = 0; r < c->ranks; r++) gone[r] = r != c->rank && exited(peerPid(c, r));
  if (DIR* d = opendir("/dev/shm")) {
    while (struct dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind(prefix, 0) != 0) continue;
      int from = -1, to = -1;
      if (sscanf(name.c_str() + prefix.size(), "%d-%d-", &from, &to) != 2) continue;
      bool ok = from >= 0 && from < c->ranks && to >= 0 && to < c->ranks;
      if (ok && (to == c->rank || gone[from] || gone[to])) unlink(("/dev/shm/" + name).c_str());
    }
    closedir(d);
  }
}
}  // namespace

extern "C" int ncclCommDestroy(void* comm) {
  if (!comm) return kInvalidArgument;
  Comm* c = (Comm*)comm;
  if (c->aborted.load(std::memory_order_acquire)) return kInvalidUsage;  // ncclCommAbort freed it
  if (c->shm) {
    sweepMessages(c);
    munmap(c->shm, c->shm_bytes);
  }
  delete c;
  return kSuccess;
}

// ncclCommAbort ends the communicator from any thread, while another may be waiting in one
// of its collectives: every wait of this rank fails at once (a shm wait within a poll), and
// for ranks of one process the whole group is broken, waking the others. Unlike NCCL's, it
// keeps the communicator's memory, since the waiting thread still reads it.
extern "C" int ncclCommAbort(void* comm) {
  if (!comm) return kInvalidArgument;
  Comm* c = (Comm*)comm;
  if (c->aborted.exchange(true)) return kSuccess;
  if (c->g) {
    std::lock_guard<std::mutex> l(c->g->mu);
    if (c->g->broken.empty()) c->g->broken = abortedError(c);
    c->g->cv.notify_all();
  }
  if (c->shm) sweepMessages(c);
  return kSuccess;
}

namespace {
int submit(void* stream, const std::string& kind, Comm* c, const void* send, void* recv, size_t count, int type, int op) {
  if (!c) return kInvalidArgument;
  if (typeSize(type) == 0) return kInvalidArgument;
  if (kind != "allgather" && kind != "broadcast" && (type != 7 && type != 9) && c->ranks > 1) return kInvalidArgument;
  // The op's own result, kept apart from the stream's so a graph replay has its own.
  auto rc = std::make_shared<int>(kSuccess);
  bool graph = StreamCapturing(stream);  // recorded now, run by the graph's replays
  Result r = Submit(stream, Op{"nccl " + kind, [=]() -> Result {
                                 *rc = collective(c, kind, send, recv, count, type, op, graph);
                                 // A dead or missing peer's message comes back with
                                 // cuGetErrorString's when the op ran deferred.
                                 if (*rc == kSystemError) return resin_emu::kLaunchFailed;
                                 return *rc == kSuccess ? 0 : 1;
                               }});
  if (r != 0 && *rc == kSuccess) return kUnhandledCudaError;
  return *rc;
}
}  // namespace

extern "C" int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, void* comm, void* stream) {
  return submit(stream, "allreduce", (Comm*)comm, send, recv, count, type, op);
}

extern "C" int ncclAllGather(const void* send, void* recv, size_t count, int type, void* comm, void* stream) {
  return submit(stream, "allgather", (Comm*)comm, send, recv, count, type, 0);
}

extern "C" int ncclReduceScatter(const void* send, void* recv, size_t count, int type, int op, void* comm,
                                 void* stream) {
  return submit(stream, "reducescatter", (Comm*)comm, send, recv, count, type, op);
}

extern "C" int ncclBroadcast(const void* send, void* recv, size_t count, int type, int root, void* comm,
                             void* stream) {
  return submit(stream, "broadcast", (Comm*)comm, send, recv, count, type, root);
}

namespace {

// Point-to-point ops, as NCCL runs them: each is stream work (recorded by a capture and
// replayed by its graph like the collectives), and the ops queued between ncclGroupStart
// and the outermost ncclGroupEnd are launched together at the end, so their order within
// the group does not matter: the group's sends go to their streams first, then its
// receives. A send copies its message when its stream reaches it (the sender may reuse its
// buffer once the receiver has it, which here is at once); a receive waits for the peer's
// next message to it.
struct P2P {
  void* stream;
  bool send;
  std::string what;
  std::function<int()> run;
};

thread_local std::vector<P2P> tl_group_ops;

int submitP2P(P2P op) {
  auto rc = std::make_shared<int>(kSuccess);
  auto run = op.run;
  Result r = Submit(op.stream, Op{op.what, [=]() -> Result {
                                   *rc = run();
                                   // As the collectives' (submit): a dead or late peer's
                                   // message comes back when the op ran deferred.
                                   if (*rc == kSystemError) return resin_emu::kLaunchFailed;
                                   return *rc == kSuccess ? 0 : 1;
                                 }});
  if (r != 0 && *rc == kSuccess) return kUnhandledCudaError;
  return *rc;
}

int queueP2P(P2P op) {
  if (tl_group_depth > 0) {
    tl_group_ops.push_back(std::move(op));
    return kSuccess;
  }
  return submitP2P(std::move(op));
}

// Between processes a message is a file, /dev/shm/<id>-p2p-<from>-<to>-<k> for the k-th
// message from rank from to rank to: the sender writes it under a temporary name and
// renames it into place; the receiver waits for it (bounded by RESIN_EMU_NCCL_TIMEOUT, and
// failing at once when the sender's process is gone), reads it and removes it. Each
// side counts its messages per peer, so the k-th send meets the k-th receive, as NCCL's
// in-order channels do.
std::string p2pPath(const Comm* c, int from, int to, unsigned long long k) {
  return "/dev/shm/" + c->key + "-p2p-" + std::to_string(from) + "-" + std::to_string(to) + "-" + std::to_string(k);
}

// shmSend writes message k to peer. A send that fails breaks the communicator and leaves
// <path>.err saying why, so the receiver fails at once rather than at the deadline.
int shmSend(Comm* c, const void* buf, size_t n, int peer) {
  if (c->aborted.load(std::memory_order_acquire)) return systemError(abortedError(c));
  if (!c->broken.empty()) return systemError(c->broken + " (the communicator failed before)");
  unsigned long long k = ++c->sent[peer];
  std::string path = p2pPath(c, c->rank, peer, k);
  std::string what = "emulated NCCL send #" + std::to_string(k) + " of rank " + std::to_string(c->rank) + " to rank " + std::to_string(peer);
  auto fail = [&](const std::string& why) {
    c->broken = what + ": " + why;
    int fd = open((path + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ssize_t w = write(fd, c->broken.data(), c->broken.size());
      (void)w;
      close(fd);
    }
    return systemError(c->broken);
  };
  int pid = peerPid(c, peer);
  if (peer != c->rank && !hangMode() && exited(pid)) return fail("the process exited (pid " + std::to_string(pid) + ")");
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);  // as private as the segment
  if (fd < 0) return fail(tmp + ": " + strerror(errno));
  const char* p = (const char*)buf;
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  bool ok = done == n;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return fail("write " + path + " failed");
  }
  return kSuccess;
}

// shmRecv reads message k from peer: it waits for the file (or the sender's .err), failing
// once the sender's process is gone and the message still is not there, or after the
// deadline; every failure breaks the communicator.
int shmRecv(Comm* c, void* buf, size_t n, int peer) {
  if (c->aborted.load(std::memory_order_acquire)) return systemError(abortedError(c));
  if (!c->broken.empty()) return systemError(c->broken + " (the communicator failed before)");
  unsigned long long k = ++c->received[peer];
  std::string path = p2pPath(c, peer, c->rank, k);
  std::string what = "emulated NCCL recv #" + std::to_string(k) + " of rank " + std::to_string(c->rank) + " from rank " + std::to_string(peer);
  auto fail = [&](const std::string& why) {
    c->broken = what + ": " + why;
    return systemError(c->broken);
  };
  int pid = peerPid(c, peer);
  auto start = std::chrono::steady_clock::now();
  long sleep_ns = 1000;
  FILE* f;
  while ((f = fopen(path.c_str(), "rb")) == nullptr) {
    if (errno != ENOENT) return fail(path + ": " + strerror(errno));
    if (FILE* e = fopen((path + ".err").c_str(), "rb")) {
      char msg[512] = {0};
      size_t m = fread(msg, 1, sizeof msg - 1, e);
      fclose(e);
      unlink((path + ".err").c_str());
      return fail("the sender failed: " + std::string(msg, m));
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, nullptr);
    sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
    if (c->aborted.load(std::memory_order_acquire)) return fail(abortedError(c));
    if (peer != c->rank && !hangMode() && exited(pid)) {
      if ((f = fopen(path.c_str(), "rb")) != nullptr) break;  // it sent, then exited
      return fail("the process exited (pid " + std::to_string(pid) + ")");
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeoutSeconds()) {
      char b[64];
      snprintf(b, sizeof b, "%.0f", timeoutSeconds());
      return fail(std::string("not there within ") + b + " s (RESIN_EMU_NCCL_TIMEOUT)");
    }
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  bool ok = size == (long)n && (n == 0 || fread(buf, 1, n, f) == n);
  fclose(f);
  unlink(path.c_str());
  if (!ok) return fail("a message of " + std::to_string(size) + " bytes where " + std::to_string(n) + " were expected");
  return kSuccess;
}

}  // namespace

extern "C" int ncclSend(const void* buf, size_t count, int type, int peer, void* comm, void* stream) {
  Comm* c = (Comm*)comm;
  if (!c || typeSize(type) == 0 || peer < 0 || peer >= c->ranks) return kInvalidArgument;
  size_t n = count * typeSize(type);
  if (c->shm) return queueP2P(P2P{stream, true, "nccl send", [=]() -> int { return shmSend(c, buf, n, peer); }});
  return queueP2P(P2P{stream, true, "nccl send", [=]() -> int {
                        std::lock_guard<std::mutex> l(c->g->mu);
                        if (!c->g->broken.empty()) return systemError(c->g->broken);
                        const char* p = (const char*)buf;
                        c->g->sends[{c->rank, peer}].emplace_back(p, p + n);
                        c->g->cv.notify_all();
                        return kSuccess;
                      }});
}

extern "C" int ncclRecv(void* buf, size_t count, int type, int peer, void* comm, void* stream) {
  Comm* c = (Comm*)comm;
  if (!c || typeSize(type) == 0 || peer < 0 || peer >= c->ranks) return kInvalidArgument;
  size_t n = count * typeSize(type);
  if (c->shm) return queueP2P(P2P{stream, false, "nccl recv", [=]() -> int { return shmRecv(c, buf, n, peer); }});
  return queueP2P(P2P{stream, false, "nccl recv", [=]() -> int {
                        Group* g = c->g.get();
                        std::unique_lock<std::mutex> l(g->mu);
                        auto key = std::make_pair(peer, c->rank);
                        if (peer == c->rank && g->sends[key].empty()) return kInvalidUsage;  // a self-receive needs its send
                        double secs = timeoutSeconds();
                        auto deadline = std::chrono::steady_clock::now() +
                                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(secs));
                        if (!g->broken.empty()) return systemError(g->broken);
                        g->cv.wait_until(l, deadline, [&] { return !g->sends[key].empty() || !g->broken.empty(); });
                        if (g->sends[key].empty()) {
                          if (g->broken.empty()) {
                            // A late send must not feed the next step's receive: the
                            // group is out of step from here on, as after a collective's
                            // timeout.
                            char b[64];
                            snprintf(b, sizeof b, "%.0f", secs);
                            g->broken = "emulated NCCL recv of rank " + std::to_string(c->rank) + " from rank " + std::to_string(peer) +
                                        ": no message within " + b + " s (RESIN_EMU_NCCL_TIMEOUT); the communicator is broken";
                            g->cv.notify_all();
                          }
                          return systemError(g->broken);
                        }
                        std::vector<char> msg = std::move(g->sends[key].front());
                        g->sends[key].erase(g->sends[key].begin());
                        if (msg.size() != n) return kInvalidUsage;
                        memcpy(buf, msg.data(), msg.size());
                        return kSuccess;
                      }});
}

extern "C" int ncclGroupStart() {
  tl_group_depth++;
  return kSuccess;
}

extern "C" int ncclGroupEnd() {
  if (tl_group_depth == 0) return kInvalidUsage;
  if (--tl_group_depth > 0) return kSuccess;
  std::vector<P2P> ops;
  ops.swap(tl_group_ops);
  int rc = kSuccess;
  for (int pass = 0; pass < 2; pass++) {
    for (P2P& op : ops) {
      if (op.send != (pass == 0)) continue;
      int r = submitP2P(std::move(op));
      if (rc == kSuccess) rc = r;
    }
  }
  return rc;
}

extern "C" const char* ncclGetErrorString(int r) {
  switch (r) {
    case kSuccess: return "no error";
    case kUnhandledCudaError: return "unhandled cuda error (emulated device)";
    case kSystemError:
      if (!tl_nccl_error.empty()) {
        static thread_local std::string text;
        text = "unhandled system error: " + tl_nccl_error;
        return text.c_str();
      }
      return "unhandled system error";
    case kInternalError: return "internal error";
    case kInvalidArgument: return "invalid argument";
    case kInvalidUsage: return "invalid usage";
  }
  return "unknown result code";
}
