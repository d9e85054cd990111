// nccl.cpp: the emulated NCCL, the calls core/cudart binds (nccl.go), for communicators
// whose ranks all live in this process (one rank per device thread). A collective blocks
// its rank's thread until every rank has queued it, then the last to arrive computes it
// for all (in rank order, so sums are reproducible) and releases the others. With one
// rank a collective is a copy.
#include <string.h>

#include <condition_variable>
#include <map>
#include <memory>

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
  // Point-to-point messages, by (from, to), in order.
  std::map<std::pair<int, int>, std::vector<std::vector<char>>> sends;
};

struct Comm {
  std::shared_ptr<Group> g;
  int rank = 0;
};

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

// collective runs one collective of rank c: it waits for every rank, and the last rank to
// arrive computes the results of all of them.
int collective(Comm* c, const std::string& kind, const void* send, void* recv, size_t count, int type, int op) {
  Group* g = c->g.get();
  size_t es = typeSize(type);
  if (es == 0) return kInvalidArgument;
  std::unique_lock<std::mutex> l(g->mu);
  if (g->arrived == 0) {
    g->kind = kind;
    g->count = count;
    g->type = type;
    g->op = op;
    g->send.assign(g->ranks, nullptr);
    g->recv.assign(g->ranks, nullptr);
  } else if (g->kind != kind || g->count != count || g->type != type || g->op != op) {
    return kInvalidUsage;  // the ranks called different collectives
  }
  g->send[c->rank] = send;
  g->recv[c->rank] = recv;
  unsigned long long gen = g->gen;
  if (++g->arrived < g->ranks) {
    g->cv.wait(l, [&] { return g->gen != gen; });
    return kSuccess;
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

thread_local int tl_group_depth = 0;

}  // namespace

extern "C" int ncclGetVersion(int* v) {
  if (!v) return kInvalidArgument;
  *v = 22105;
  return kSuccess;
}

extern "C" int ncclGetUniqueId(UniqueID* id) {
  if (!id) return kInvalidArgument;
  memset(id, 0, sizeof *id);
  std::lock_guard<std::mutex> l(g_mu);
  snprintf(id->internal, sizeof id->internal, "resin-emu-nccl-%llu", g_next_id++);
  return kSuccess;
}

extern "C" int ncclCommInitRank(void** comm, int nranks, UniqueID id, int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return kInvalidArgument;
  std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
  if (key.rfind("resin-emu-nccl-", 0) != 0) return kInvalidArgument;
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
  // Every rank blocks until all have joined, as ncclCommInitRank does.
  std::unique_lock<std::mutex> l(g->mu);
  g->joined++;
  if (g->joined > nranks) return kInvalidUsage;
  g->cv.notify_all();
  g->cv.wait(l, [&] { return g->joined >= nranks; });
  Comm* c = new Comm();
  c->g = g;
  c->rank = rank;
  *comm = c;
  return kSuccess;
}

extern "C" int ncclCommDestroy(void* comm) {
  if (!comm) return kInvalidArgument;
  delete (Comm*)comm;
  return kSuccess;
}

namespace {
int submit(void* stream, const std::string& kind, Comm* c, const void* send, void* recv, size_t count, int type, int op) {
  if (!c) return kInvalidArgument;
  if (typeSize(type) == 0) return kInvalidArgument;
  if (kind != "allgather" && kind != "broadcast" && (type != 7 && type != 9) && c->g->ranks > 1) return kInvalidArgument;
  // The op's own result, kept apart from the stream's so a graph replay has its own.
  auto rc = std::make_shared<int>(kSuccess);
  Result r = Submit(stream, Op{"nccl " + kind, [=]() -> Result {
                                 *rc = collective(c, kind, send, recv, count, type, op);
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

}  // namespace

extern "C" int ncclSend(const void* buf, size_t count, int type, int peer, void* comm, void* stream) {
  Comm* c = (Comm*)comm;
  if (!c || typeSize(type) == 0 || peer < 0 || peer >= c->g->ranks) return kInvalidArgument;
  size_t n = count * typeSize(type);
  return queueP2P(P2P{stream, true, "nccl send", [=]() -> int {
                        std::lock_guard<std::mutex> l(c->g->mu);
                        const char* p = (const char*)buf;
                        c->g->sends[{c->rank, peer}].emplace_back(p, p + n);
                        c->g->cv.notify_all();
                        return kSuccess;
                      }});
}

extern "C" int ncclRecv(void* buf, size_t count, int type, int peer, void* comm, void* stream) {
  Comm* c = (Comm*)comm;
  if (!c || typeSize(type) == 0 || peer < 0 || peer >= c->g->ranks) return kInvalidArgument;
  size_t n = count * typeSize(type);
  return queueP2P(P2P{stream, false, "nccl recv", [=]() -> int {
                        Group* g = c->g.get();
                        std::unique_lock<std::mutex> l(g->mu);
                        auto key = std::make_pair(peer, c->rank);
                        if (peer == c->rank && g->sends[key].empty()) return kInvalidUsage;  // a self-receive needs its send
                        g->cv.wait(l, [&] { return !g->sends[key].empty(); });
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
    case kSystemError: return "unhandled system error";
    case kInternalError: return "internal error";
    case kInvalidArgument: return "invalid argument";
    case kInvalidUsage: return "invalid usage";
  }
  return "unknown result code";
}
