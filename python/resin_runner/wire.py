"""The Resin runner protocol, version 1: frames and messages (docs/runner-protocol.md).

Everything is little endian. A frame is ``length u32 | kind u8 | payload`` where length
counts the kind byte and the payload. The engine sends Hello, Step and Shutdown; the runner
sends Info, Result and Error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

VERSION = 1
MAGIC = b"RSNW"
DEFAULT_MAX_FRAME = 64 << 20

KIND_HELLO = 1
KIND_INFO = 2
KIND_STEP = 3
KIND_RESULT = 4
KIND_ERROR = 5
KIND_SHUTDOWN = 6

CAP_CACHE_OPS = 1
CAP_RELEASES = 2
CAP_TOKEN_MASKS = 4  # the runner's sampler applies the steps' token masks (X & 32)

CODE_STEP_FAILED = 1
CODE_FATAL = 2
CODE_PROTOCOL = 3

OP_COPY_PAGE = 1
RELEASE_FINISHED, RELEASE_ABORTED, RELEASE_PREEMPTED = 1, 2, 3

KIND_FULL, KIND_SLIDING_WINDOW, KIND_COMPRESSED, KIND_RECURRENT = 0, 1, 2, 3

NO_PAGE = 0xFFFFFFFF
NO_SLOT = -1

OPT_PENALTIES, OPT_BIAS, OPT_STOPS, OPT_HISTORY, OPT_PROMPT, OPT_MASKS = 1, 2, 4, 8, 16, 32
OPT_ALL = 63

MAX_TOP_LOGPROBS = 20


class WireError(Exception):
    """Bytes that do not decode: a malformed frame or message, a wrong version, a frame
    over the size limit."""


# --- frames -----------------------------------------------------------------------------


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack("<IB", len(payload) + 1, kind) + payload


# _read_exact reads at most this much at a time: a frame length that lies (a truncated or
# hostile stream) costs memory in proportion to the bytes that arrive, not to the claim
# (a buffered reader allocates the whole count it is asked for before reading).
_READ_CHUNK = 1 << 20


def _read_exact(stream, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = stream.read(min(n - got, _READ_CHUNK))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_frame(stream, max_frame: int = DEFAULT_MAX_FRAME):
    """Returns (kind, payload), or None when the stream ends between frames."""
    hdr = _read_exact(stream, 4)
    if not hdr:
        return None
    if len(hdr) < 4:
        raise WireError(f"stream ended inside a frame header ({len(hdr)} of 4 bytes)")
    (n,) = struct.unpack("<I", hdr)
    if n == 0:
        raise WireError("frame of length 0 has no kind byte")
    if n > max_frame:
        raise WireError(f"a frame of {n} bytes, the limit is {max_frame}")
    body = _read_exact(stream, n)
    if len(body) < n:
        raise WireError(f"stream ended inside a frame ({len(body)} of {n} bytes)")
    return body[0], body[1:]


# --- decoding helpers ---------------------------------------------------------------------


class _Dec:
    def __init__(self, b: bytes, at: str):
        self.b = memoryview(b)
        self.off = 0
        self.at = at

    def fail(self, msg: str):
        raise WireError(f"{self.at}: {msg}")

    def left(self) -> int:
        return len(self.b) - self.off

    def take(self, n: int) -> memoryview:
        if n < 0 or n > self.left():
            self.fail(f"need {n} bytes at offset {self.off}, {self.left()} left")
        out = self.b[self.off : self.off + n]
        self.off += n
        return out

    def unpack(self, fmt: str):
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size))

    def u8(self) -> int:
        return self.unpack("B")[0]

    def u16(self) -> int:
        return self.unpack("H")[0]

    def u32(self) -> int:
        return self.unpack("I")[0]

    def u64(self) -> int:
        return self.unpack("Q")[0]

    def i32(self) -> int:
        return self.unpack("i")[0]

    def count(self, what: str, size: int) -> int:
        n = self.u32()
        if n * size > self.left():
            self.fail(f"{what}: {n} entries of {size} bytes do not fit in the {self.left()} bytes left")
        return n

    def arr(self, dtype: str, n: int) -> np.ndarray:
        dt = np.dtype(dtype).newbyteorder("<")
        return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).astype(dt.newbyteorder("="), copy=True)

    def str(self, what: str) -> str:
        n = self.count(what, 1)
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    def end(self):
        if self.left():
            self.fail(f"{self.left()} trailing bytes")


def _pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def _le(a, dtype: str) -> bytes:
    return np.asarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


# --- hello / info -------------------------------------------------------------------------


@dataclass
class Hello:
    version: int = VERSION
    max_frame: int = DEFAULT_MAX_FRAME
    caps: int = 0


def encode_hello(h: Hello) -> bytes:
    return frame(KIND_HELLO, MAGIC + struct.pack("<HHII", h.version, 0, h.max_frame, h.caps))


def decode_hello(payload: bytes) -> Hello:
    d = _Dec(payload, "hello")
    if bytes(d.take(4)) != MAGIC:
        d.fail(f"magic is not {MAGIC!r}")
    version, res = d.u16(), d.u16()
    if res:
        d.fail(f"reserved field {res}")
    h = Hello(version, d.u32(), d.u32())
    d.end()
    if h.version != VERSION:
        raise WireError(f"protocol version mismatch: the engine speaks version {h.version}, this runner {VERSION}")
    return h


@dataclass
class CacheGroup:
    name: str
    kind: int
    layers: int
    bytes_per_token: int
    page_tokens: int
    window: int = 0
    ratio: int = 0
    checkpoints: int = 0


@dataclass
class RunnerInfo:
    name: str
    vocab_size: int
    max_context: int
    eos: list[int] = field(default_factory=list)
    cache_groups: list[CacheGroup] = field(default_factory=list)
    graph_buckets: list[int] = field(default_factory=list)
    max_drafts: int = 0
    async_tokens: bool = False


def encode_info(info: RunnerInfo, caps: int = CAP_CACHE_OPS | CAP_RELEASES, version: int = VERSION) -> bytes:
    out = [struct.pack("<HHI", version, 0, caps), _pack_str(info.name)]
    out.append(struct.pack("<IIII", info.vocab_size, info.max_context, info.max_drafts, 1 if info.async_tokens else 0))
    out.append(struct.pack("<I", len(info.eos)) + _le(info.eos, "i4"))
    out.append(struct.pack("<I", len(info.graph_buckets)) + _le(info.graph_buckets, "u4"))
    out.append(struct.pack("<I", len(info.cache_groups)))
    for g in info.cache_groups:
        out.append(_pack_str(g.name))
        out.append(struct.pack("<BBH6I", g.kind, 0, 0, g.layers, g.bytes_per_token, g.page_tokens, g.window, g.ratio, g.checkpoints))
    return frame(KIND_INFO, b"".join(out))


def decode_info(payload: bytes) -> tuple[int, RunnerInfo]:
    """Returns (caps, info)."""
    d = _Dec(payload, "info")
    version, res = d.u16(), d.u16()
    if res:
        d.fail(f"reserved field {res}")
    if version != VERSION:
        raise WireError(f"protocol version mismatch: the runner speaks version {version}, this side {VERSION}")
    caps = d.u32()
    name = d.str("name")
    vocab, max_ctx, drafts, flags = d.unpack("IIII")
    if flags & ~1:
        d.fail(f"unknown flags {flags:#x}")
    eos = d.arr("i4", d.count("eos", 4)).tolist()
    buckets = d.arr("u4", d.count("graph buckets", 4)).tolist()
    groups = []
    for i in range(d.count("cache groups", 32)):
        gname = d.str("group name")
        kind, p1, p2 = d.unpack("BBH")
        if p1 or p2:
            d.fail(f"group {i}: padding")
        if kind > KIND_RECURRENT:
            d.fail(f"group {i}: unknown kind {kind}")
        groups.append(CacheGroup(gname, kind, *d.unpack("6I")))
    d.end()
    return caps, RunnerInfo(name, vocab, max_ctx, eos, groups, buckets, drafts, bool(flags & 1))


# --- errors, shutdown ---------------------------------------------------------------------


def encode_error(step: int, code: int, message: str) -> bytes:
    return frame(KIND_ERROR, struct.pack("<QHH", step, code, 0) + _pack_str(message))


def decode_error(payload: bytes) -> tuple[int, int, str]:
    d = _Dec(payload, "error")
    step, code, res = d.unpack("QHH")
    if res:
        d.fail(f"reserved field {res}")
    msg = d.str("message")
    d.end()
    return step, code, msg


def encode_shutdown() -> bytes:
    return frame(KIND_SHUTDOWN, b"")


# --- results ------------------------------------------------------------------------------


@dataclass
class StepResult:
    accepted: list[int] = field(default_factory=list)
    num_next_drafts: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_tokens: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_tokens: list[int] = field(default_factory=list)
    prompt_top_logprobs: list[float] = field(default_factory=list)

    _ORDER = (
        ("accepted", "i4"), ("num_next_drafts", "i4"), ("tokens", "i4"), ("drafts", "i4"),
        ("logprobs", "f4"), ("top_tokens", "i4"), ("top_logprobs", "f4"),
        ("prompt_logprobs", "f4"), ("prompt_top_tokens", "i4"), ("prompt_top_logprobs", "f4"),
    )


def encode_result(step: int, r: StepResult) -> bytes:
    arrays = [getattr(r, name) for name, _ in StepResult._ORDER]
    head = struct.pack("<Q10I", step, *(len(a) for a in arrays))
    body = b"".join(_le(a, dt) for a, (_, dt) in zip(arrays, StepResult._ORDER))
    return frame(KIND_RESULT, head + body)


def decode_result(payload: bytes) -> tuple[int, StepResult]:
    d = _Dec(payload, "result")
    step = d.u64()
    counts = d.unpack("10I")
    if 4 * sum(counts) != d.left():
        d.fail(f"counts {counts} need {4 * sum(counts)} bytes, the payload has {d.left()}")
    r = StepResult()
    for (name, dt), n in zip(StepResult._ORDER, counts):
        setattr(r, name, d.arr(dt, n).tolist())
    d.end()
    return step, r


# --- steps --------------------------------------------------------------------------------


@dataclass
class CacheOp:
    kind: int
    group: int
    src: int
    dst: int


@dataclass
class Release:
    req_id: int
    reason: int


@dataclass
class Plan:
    """One step's BatchPlan, page tables rebuilt from the runner's Tables. Per-sequence
    arrays have B entries, per-token arrays T; page_tables[g][i] is sequence i's table in
    group g (uint32 page ids)."""

    step: int
    graph_batch: int
    req_ids: np.ndarray
    computed: np.ndarray
    scheduled: np.ndarray
    prompt_len: np.ndarray
    num_drafts: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    min_p: np.ndarray
    seed: np.ndarray
    logprobs: np.ndarray
    query_start: np.ndarray
    logits_start: np.ndarray
    tokens: np.ndarray
    positions: np.ndarray
    logits_indices: np.ndarray
    slot_mapping: list[np.ndarray]
    state_page: list[np.ndarray]
    page_tables: list[list[np.ndarray]]
    cache_ops: list[CacheOp]
    released: list[Release]
    presence_penalty: np.ndarray | None = None
    frequency_penalty: np.ndarray | None = None
    repetition_penalty: np.ndarray | None = None
    min_tokens: np.ndarray | None = None
    logit_bias_start: np.ndarray | None = None
    logit_bias_tokens: np.ndarray | None = None
    logit_bias_values: np.ndarray | None = None
    stop_ids_start: np.ndarray | None = None
    stop_ids: np.ndarray | None = None
    history_start: np.ndarray | None = None
    history: np.ndarray | None = None
    prompt_logprobs: np.ndarray | None = None
    prompt_next: np.ndarray | None = None
    token_mask_start: np.ndarray | None = None
    token_mask: np.ndarray | None = None

    def token_mask_of(self, i: int, j: int = 0):
        """The token mask (uint32 words, bit t%32 of word t//32 allows token t) of sequence
        i's logits row j, or None when the sequence is not constrained (see the Go
        BatchPlan.TokenMaskOf)."""
        if self.token_mask_start is None:
            return None
        a, b = int(self.token_mask_start[i]), int(self.token_mask_start[i + 1])
        rows = int(self.logits_start[i + 1]) - int(self.logits_start[i])
        if a == b or rows == 0 or j >= rows:
            return None
        w = (b - a) // rows
        return self.token_mask[a + j * w : a + (j + 1) * w]

    @property
    def num_seqs(self) -> int:
        return len(self.req_ids)

    def prompt_rows(self, i: int) -> int:
        """Rows of sequence i scored for prompt logprobs (see the Go BatchPlan.PromptRows)."""
        if self.prompt_logprobs is None or self.prompt_logprobs[i] < 0:
            return 0
        c = int(self.computed[i])
        return max(0, min(c + int(self.scheduled[i]), int(self.prompt_len[i]) - 1) - c)


INT32_MAX = (1 << 31) - 1

STEP_HEADER = struct.Struct("<Qi11I")


class Tables:
    """The page tables the runner holds per request, which each Step's deltas update."""

    def __init__(self):
        self.by_req: dict[int, list[np.ndarray]] = {}

    def clear(self):
        self.by_req.clear()

    def decode_step(self, payload: bytes) -> Plan:
        d = _Dec(payload, "step")
        if len(payload) < STEP_HEADER.size:
            d.fail(f"{len(payload)} bytes, shorter than the {STEP_HEADER.size}-byte header")
        step, graph, B, T, L, G, X, NB, NS, NH, nops, nrel, ndelta = d.unpack("Qi11I")
        if X & ~OPT_ALL:
            d.fail(f"unknown optional arrays {X:#x}")
        need = 12 * nrel + 16 * nops + 52 * B + 8 * (B + 1) + 8 * T + 4 * L + G * (4 + 8 * T) + 16 * ndelta
        if X & OPT_PENALTIES:
            need += 16 * B
        if X & OPT_PROMPT:
            need += 8 * B
        if X & OPT_MASKS:
            need += 4 * (B + 1)  # and the words token_mask_start[B] says
        for bit, n in ((OPT_BIAS, 2 * NB), (OPT_STOPS, NS), (OPT_HISTORY, NH)):
            if X & bit:
                need += 4 * (B + 1) + 4 * n
            elif n:
                d.fail(f"{n} values of an absent optional array")
        if G > 1 << 10 or need > d.left():
            d.fail(f"{B} sequences, {T} tokens, {G} groups, {nops} ops, {nrel} releases, {ndelta} deltas do not fit in {d.left()} bytes")
        released = []
        for i in range(nrel):
            rid, reason = d.unpack("QI")
            if not RELEASE_FINISHED <= reason <= RELEASE_PREEMPTED:
                d.fail(f"release {i}: unknown reason {reason}")
            released.append(Release(rid, reason))
        ops = []
        for i in range(nops):
            kind, group, src, dst = d.unpack("IiII")
            if kind != OP_COPY_PAGE or not 0 <= group < G:
                d.fail(f"cache op {i}: kind {kind} on group {group} of {G}")
            ops.append(CacheOp(kind, group, src, dst))
        kw = {}
        kw["req_ids"] = d.arr("u8", B)
        for name, dt in (("computed", "i4"), ("scheduled", "i4"), ("prompt_len", "i4"), ("num_drafts", "i4"),
                         ("temperature", "f4"), ("top_p", "f4"), ("top_k", "i4"), ("min_p", "f4"),
                         ("seed", "u8"), ("logprobs", "i4")):
            kw[name] = d.arr(dt, B)
        if X & OPT_PENALTIES:
            for name, dt in (("presence_penalty", "f4"), ("frequency_penalty", "f4"), ("repetition_penalty", "f4"), ("min_tokens", "i4")):
                kw[name] = d.arr(dt, B)
        kw["query_start"] = d.arr("i4", B + 1)
        kw["logits_start"] = d.arr("i4", B + 1)
        kw["tokens"] = d.arr("i4", T)
        kw["positions"] = d.arr("i4", T)
        kw["logits_indices"] = d.arr("i4", L)
        if X & OPT_BIAS:
            kw["logit_bias_start"] = d.arr("i4", B + 1)
            kw["logit_bias_tokens"] = d.arr("i4", NB)
            kw["logit_bias_values"] = d.arr("f4", NB)
        if X & OPT_STOPS:
            kw["stop_ids_start"] = d.arr("i4", B + 1)
            kw["stop_ids"] = d.arr("i4", NS)
        if X & OPT_HISTORY:
            kw["history_start"] = d.arr("i4", B + 1)
            kw["history"] = d.arr("i4", NH)
        if X & OPT_PROMPT:
            kw["prompt_logprobs"] = d.arr("i4", B)
            kw["prompt_next"] = d.arr("i4", B)
        if X & OPT_MASKS:
            kw["token_mask_start"] = start = d.arr("i4", B + 1)
            n = int(start[B])
            if n < 0 or 4 * n > d.left():
                d.fail(f"{n} token-mask words, {d.left()} bytes left")
            kw["token_mask"] = d.arr("u4", n)
        slots, states = [], []
        for _ in range(G):
            ns = d.count("state pages", 4)
            slots.append(d.arr("i8", T))
            states.append(d.arr("u4", ns))
        _validate(d, B, T, L, kw)
        for r in released:
            self.by_req.pop(r.req_id, None)
        req_ids = kw["req_ids"].tolist()
        for _ in range(ndelta):
            self._apply_delta(d, req_ids, G)
        d.end()
        tables = [[self.table(rid, g) for rid in req_ids] for g in range(G)]
        return Plan(step=step, graph_batch=graph, slot_mapping=slots, state_page=states, page_tables=tables,
                    cache_ops=ops, released=released, **kw)

    def table(self, req_id: int, g: int) -> np.ndarray:
        ts = self.by_req.get(req_id)
        if ts is None or g >= len(ts):
            return np.zeros(0, dtype=np.uint32)
        return ts[g]

    def _apply_delta(self, d: _Dec, req_ids: list[int], groups: int):
        row, g, new_len, runs = d.unpack("4I")
        if row >= len(req_ids) or g >= groups:
            d.fail(f"table delta for row {row}, group {g} of a plan of {len(req_ids)} rows, {groups} groups")
        rid = req_ids[row]
        ts = self.by_req.setdefault(rid, [np.zeros(0, dtype=np.uint32) for _ in range(groups)])
        if len(ts) != groups:
            # The group count is the runner's, fixed for the session: a step that changes it
            # for a request an earlier step built is forged.
            d.fail(f"table delta for request {rid}, which has tables for {len(ts)} cache groups, in a step of {groups} groups")
        old = ts[g]
        if new_len > len(old) + d.left() // 4:
            d.fail(f"table delta grows request {rid}'s group {g} table from {len(old)} to {new_len} entries")
        table = np.empty(new_len, dtype=np.uint32)
        keep = min(len(old), new_len)
        table[:keep] = old[:keep]
        covered, end = len(old), 0
        for _ in range(runs):
            start, count = d.unpack("II")
            if start < end or start + count > new_len or count == 0:
                d.fail(f"table delta of request {rid}, group {g}: run [{start}, {start + count}) after {end} in a table of {new_len}")
            table[start : start + count] = d.arr("u4", count)
            if start <= covered < start + count:
                covered = start + count
            end = start + count
        if covered < new_len:
            d.fail(f"table delta of request {rid}, group {g} leaves entries {covered}..{new_len - 1} unwritten")
        ts[g] = table


def _validate(d: _Dec, B: int, T: int, L: int, kw: dict):
    """The checks of the Go BatchPlan.Validate a runner relies on: offsets in range,
    positions consecutive, logits rows inside their sequence."""
    qs, ls = kw["query_start"], kw["logits_start"]
    for name, off, total in (("query_start", qs, T), ("logits_start", ls, L)):
        if off[0] != 0 or off[-1] != total or np.any(np.diff(off) < 0):
            d.fail(f"{name} does not run from 0 to {total}")
    ms = kw.get("token_mask_start")
    if ms is not None:
        if ms[0] != 0 or np.any(np.diff(ms) < 0):
            d.fail("token_mask_start does not run from 0 up")
        words = 0
        for i in range(B):
            n, rows = int(ms[i + 1] - ms[i]), int(ls[i + 1] - ls[i])
            if n == 0:
                continue
            if rows == 0 or n % rows or words and n // rows != words:
                d.fail(f"sequence {i} has {n} mask words for {rows} logits rows")
            words = n // rows
    for i in range(B):
        a, b = int(qs[i]), int(qs[i + 1])
        if kw["scheduled"][i] != b - a or b == a:
            d.fail(f"sequence {i} schedules {kw['scheduled'][i]} tokens, offsets say {b - a}")
        c = int(kw["computed"][i])
        if c + (b - a) - 1 > INT32_MAX:  # the last position, c + n - 1, must fit
            d.fail(f"sequence {i}: positions {c}..{c + b - a - 1} wrap int32")
        if c < 0 or not np.array_equal(kw["positions"][a:b], np.arange(c, c + b - a, dtype=np.int32)):
            d.fail(f"sequence {i}: positions are not {c}..{c + b - a - 1}")
        rows = kw["logits_indices"][ls[i] : ls[i + 1]]
        if np.any((rows < a) | (rows >= b)):
            d.fail(f"sequence {i}: a logits row outside its tokens [{a}, {b})")
        lp = int(kw["logprobs"][i])
        if lp < -1 or lp > MAX_TOP_LOGPROBS:
            d.fail(f"sequence {i}: logprobs {lp}")
