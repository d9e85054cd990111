"""Sampling as the Go engine.Sampler does it: logit bias, min-tokens stop mask and
penalties, then greedy (temperature 0 or top-k 1) or seeded temperature sampling with
top-k, top-p and min-p, where the random number depends only on (seed, position). Given the
same logits it picks the same token as the Go sampler."""

from __future__ import annotations

import math

import numpy as np

from .wire import Plan, StepResult

M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64's finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def uniform(seed: int, pos: int) -> float:
    x = mix64(seed ^ mix64(pos & M64))
    return float(x >> 11) / float(1 << 53)


def log_sum_exp(x: np.ndarray) -> np.float32:
    m = x[int(np.argmax(x))]
    return np.float32(m + np.float32(math.log(np.sum(np.exp((x - m).astype(np.float64))))))


def _row(plan: Plan, i: int) -> dict:
    def csr(start, values, i):
        if start is None:
            return values[:0] if values is not None else np.zeros(0, np.int32)
        return values[start[i] : start[i + 1]]

    r = dict(temperature=float(plan.temperature[i]), top_p=float(plan.top_p[i]), top_k=int(plan.top_k[i]),
             min_p=float(plan.min_p[i]), seed=int(plan.seed[i]), logprobs=int(plan.logprobs[i]),
             prompt_len=int(plan.prompt_len[i]), presence=0.0, frequency=0.0, repetition=0.0, min_tokens=0)
    if plan.presence_penalty is not None:
        r.update(presence=float(plan.presence_penalty[i]), frequency=float(plan.frequency_penalty[i]),
                 repetition=float(plan.repetition_penalty[i]), min_tokens=int(plan.min_tokens[i]))
    r["bias_tokens"] = csr(plan.logit_bias_start, plan.logit_bias_tokens, i)
    r["bias_values"] = csr(plan.logit_bias_start, plan.logit_bias_values, i)
    r["stop_ids"] = csr(plan.stop_ids_start, plan.stop_ids, i)
    r["history"] = csr(plan.history_start, plan.history, i)
    return r


def _penalized(r) -> bool:
    return r["presence"] != 0 or r["frequency"] != 0 or (r["repetition"] != 0 and r["repetition"] != 1)


def adjust(logits: np.ndarray, r: dict, pos: int) -> np.ndarray:
    n = len(logits)
    bias, stops, hist = r["bias_tokens"], r["stop_ids"], r["history"]
    if not (len(bias) or (len(hist) and _penalized(r)) or (len(stops) and pos < r["prompt_len"] + r["min_tokens"])):
        return logits
    adj = logits.astype(np.float32, copy=True)
    for t, v in zip(bias.tolist(), r["bias_values"].tolist()):
        if 0 <= t < n:
            adj[t] = np.float32(adj[t] + np.float32(v))
    if pos < r["prompt_len"] + r["min_tokens"]:
        for t in stops.tolist():
            if 0 <= t < n:
                adj[t] = -np.inf
    if not len(hist) or not _penalized(r):
        return adj
    split = min(r["prompt_len"], len(hist))
    in_prompt, count = set(), {}
    for t in hist[:split].tolist():
        if 0 <= t < n:
            in_prompt.add(t)
    for t in hist[split:].tolist():
        if 0 <= t < n:
            count[t] = count.get(t, 0) + 1
    rep = np.float32(r["repetition"] or 1)
    for t in dict.fromkeys(hist.tolist()):
        if not 0 <= t < n or (t not in in_prompt and t not in count):
            continue
        l = adj[t]
        if rep != 1:
            l = np.float32(l / rep) if l > 0 else np.float32(l * rep)
        c = count.get(t, 0)
        if c > 0:
            l = np.float32(l - (np.float32(r["frequency"]) * np.float32(c) + np.float32(r["presence"])))
        adj[t] = l
    return adj


def choose(logits: np.ndarray, r: dict, pos: int) -> int:
    if r["temperature"] == 0 or r["top_k"] == 1:
        return int(np.argmax(logits))
    n = len(logits)
    idx = np.arange(n)
    top_p, top_k = np.float32(r["top_p"]), r["top_k"]
    if top_k > 0 or (0 < top_p < 1):
        idx = np.lexsort((idx, -logits.astype(np.float64)))  # descending logits, ties by id
        if 0 < top_k < n:
            idx = idx[:top_k]
    inv = 1 / float(np.float32(r["temperature"]))
    cand = logits[idx].astype(np.float64)
    p64 = np.exp((cand - cand.max()) * inv)
    probs = p64.astype(np.float32)
    total = _seqsum(p64)
    min_p = np.float32(r["min_p"])
    if min_p > 0:
        cut = np.float32(min_p * probs.max())
        probs = np.where(probs < cut, np.float32(0), probs)
        total = _seqsum(probs.astype(np.float64))
    if 0 < top_p < 1:
        acc = np.cumsum(probs.astype(np.float64))
        hit = np.nonzero(acc >= float(top_p) * total)[0]
        keep = int(hit[0]) + 1 if len(hit) else len(probs)
        idx, probs = idx[:keep], probs[:keep]
        total = _seqsum(probs.astype(np.float64))
    u = uniform(r["seed"], pos) * total
    acc, last = 0.0, -1
    for k, p in enumerate(probs.tolist()):
        if p == 0:
            continue
        acc += p
        last = int(idx[k])
        if u < acc:
            return last
    return last


def _seqsum(a: np.ndarray) -> float:
    s = 0.0
    for v in a.tolist():
        s += v
    return s


def top_logprobs(logits: np.ndarray, lse, k: int):
    lp = (logits - lse).astype(np.float32)
    order = np.argsort(-lp.astype(np.float64), kind="stable")[: min(k, len(lp))]
    return order.tolist(), lp[order].tolist()


def apply_mask(logits: np.ndarray, adj: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The adjusted logits with the tokens the grammar's mask does not allow at -inf (ids
    past the mask are not allowed). When the min-tokens gate masked every token the
    grammar allows, the grammar wins, as in the Go engine.Sampler."""
    n = len(logits)
    bits = ((np.asarray(mask, dtype=np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(bool).reshape(-1)
    allowed = np.zeros(n, dtype=bool)
    k = min(n, len(bits))
    allowed[:k] = bits[:k]
    out = np.where(allowed, adj, np.float32(-np.inf)).astype(np.float32)
    if not np.any(np.isfinite(out)):
        out = np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32)
    return out


def sample_plan(plan: Plan, logits: np.ndarray, all_rows: bool = False) -> StepResult:
    """Samples one token per sequence with a logits row. logits holds the rows of
    plan.logits_indices, or of every token row when all_rows (prompt logprobs)."""
    res = StepResult()
    B = plan.num_seqs
    any_lp = bool(np.any(plan.logprobs >= 0))
    res.num_next_drafts = [0] * B
    for i in range(B):
        lo, hi = int(plan.logits_start[i]), int(plan.logits_start[i + 1])
        if lo == hi:
            res.accepted.append(0)
            continue
        tok_row = int(plan.logits_indices[hi - 1])
        row = logits[tok_row] if all_rows else logits[hi - 1]
        row = np.asarray(row, dtype=np.float32)
        pos = int(plan.positions[tok_row]) + 1
        r = _row(plan, i)
        lse = log_sum_exp(row)
        adj = adjust(row, r, pos)
        mask = plan.token_mask_of(i, hi - lo - 1)
        if mask is not None:
            adj = apply_mask(row, adj, mask)
        tok = choose(adj, r, pos)
        res.accepted.append(1)
        res.tokens.append(tok)
        if any_lp:
            res.logprobs.append(float(np.float32(row[tok] - lse)))
        if r["logprobs"] > 0:
            t, l = top_logprobs(row, lse, r["logprobs"])
            res.top_tokens += t
            res.top_logprobs += l
    if all_rows and plan.prompt_logprobs is not None:
        for i in range(B):
            k = int(plan.prompt_logprobs[i])
            qs = int(plan.query_start[i])
            for j in range(plan.prompt_rows(i)):
                target = int(plan.tokens[qs + j + 1]) if j + 1 < int(plan.scheduled[i]) else int(plan.prompt_next[i])
                row = np.asarray(logits[qs + j], dtype=np.float32)
                lse = log_sum_exp(row)
                res.prompt_logprobs.append(float(np.float32(row[target] - lse)))
                if k > 0:
                    t, l = top_logprobs(row, lse, k)
                    res.prompt_top_tokens += t
                    res.prompt_top_logprobs += l
    return res
