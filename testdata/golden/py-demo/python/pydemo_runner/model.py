"""The py-demo model as a Resin runner: the forward pass, its paged KV cache, and the
weights it loads.

This file is yours. It starts as the Llama-family reference (GQA, RoPE, SwiGLU, RMSNorm;
the Llama, Qwen2, Qwen3 and Mistral variants) in numpy, so the runtime generates from the
first minute. Replace the forward with your model's (PyTorch, JAX, a vendor SDK: anything
the interpreter imports) and keep the contract of execute(): the engine sends a frozen
BatchPlan (resin_runner.wire.Plan) and takes back one StepResult. What the plan means:

- tokens[t] at positions[t]; sequence i owns the token rows query_start[i]:query_start[i+1],
  of which the first computed[i] positions are already in the cache;
- slot_mapping[0][t] is where token t's K/V goes: page = slot // page_tokens, offset =
  slot % page_tokens; page_tables[0][i] lists sequence i's pages in order;
- cache_ops (run before the forward) copy one page onto another: a copy-on-write of a page
  shared through the prefix cache;
- logits_indices names the rows whose logits are sampled (resin_runner.sampling does it as
  the Go sampler does, so seeded sampling gives the same tokens whichever runner runs).
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import numpy as np

from resin_runner import Runner, RunnerInfo, StepFailed, wire
from resin_runner.safetensors import load_dir
from resin_runner.sampling import sample_plan

NAME = "py-demo"


class Config:
    """The fields of HF config.json the forward reads."""

    def __init__(self, raw: dict):
        arch = (raw.get("architectures") or [""])[0]
        mt = raw.get("model_type") or {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                                       "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "mistral"}.get(arch, "")
        if mt not in ("llama", "qwen2", "qwen3", "mistral"):
            raise ValueError(f"config.json: model_type {mt!r} is not one this forward implements (llama, qwen2, qwen3, mistral)")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {raw.get('hidden_act')!r}: the MLP is SwiGLU (silu)")
        self.raw = raw
        self.model_type = mt
        self.vocab = int(raw["vocab_size"])
        self.hidden = int(raw["hidden_size"])
        self.inter = int(raw["intermediate_size"])
        self.layers = int(raw["num_hidden_layers"])
        self.heads = int(raw["num_attention_heads"])
        self.kv_heads = int(raw.get("num_key_value_heads") or self.heads)
        hd = raw.get("head_dim")
        self.head_dim = int(hd) if hd is not None else (128 if mt == "qwen3" else self.hidden // self.heads)
        self.eps = float(raw.get("rms_norm_eps", 1e-6))
        self.theta = float(raw.get("rope_theta", 10000.0))
        self.rope_scaling = raw.get("rope_scaling") or {}
        self.max_pos = int(raw.get("max_position_embeddings", 4096))
        self.tie = bool(raw.get("tie_word_embeddings", False))
        bias = bool(raw.get("attention_bias", False))
        self.qkv_bias = mt == "qwen2" or bias
        self.o_bias = mt != "qwen2" and bias
        self.qk_norm = mt == "qwen3"
        self.window = 0
        if mt == "mistral":
            w = raw.get("sliding_window", 4096)
            self.window = int(w) if w is not None else 0
        eos = raw.get("eos_token_id")
        self.eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])

    def inv_freq(self) -> np.ndarray:
        """The rotary frequencies, with default, linear or llama3 rope scaling."""
        d = self.head_dim
        inv = np.array([math.pow(self.theta, -2 * i / d) for i in range(d // 2)], dtype=np.float64)
        rs = self.rope_scaling
        kind = rs.get("rope_type") or rs.get("type") or "default"
        if kind == "default":
            return inv
        if kind == "linear":
            return inv / float(rs["factor"])
        if kind == "llama3":
            f, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
            old = float(rs["original_max_position_embeddings"])
            out = inv.copy()
            for i, fr in enumerate(inv):
                wave = 2 * math.pi / fr
                if wave > old / lo:
                    out[i] = fr / f
                elif wave >= old / hi:
                    s = (old / wave - lo) / (hi - lo)
                    out[i] = (1 - s) * fr / f + s * fr
            return out
        raise ValueError(f"config.json: rope_scaling type {kind!r} is not implemented")


# Tensor names per layer, as HF checkpoints name them.
LAYER_TENSORS = {
    "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight", "mlp_norm": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}


def tensor_shapes(c: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model by HF name, with its shape."""
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    out = {"model.embed_tokens.weight": (c.vocab, c.hidden), "model.norm.weight": (c.hidden,)}
    if not c.tie:
        out["lm_head.weight"] = (c.vocab, c.hidden)
    for i in range(c.layers):
        p = f"model.layers.{i}."
        out.update({p + LAYER_TENSORS["attn_norm"]: (c.hidden,), p + LAYER_TENSORS["mlp_norm"]: (c.hidden,),
                    p + LAYER_TENSORS["q"]: (q, c.hidden), p + LAYER_TENSORS["k"]: (kv, c.hidden),
                    p + LAYER_TENSORS["v"]: (kv, c.hidden), p + LAYER_TENSORS["o"]: (c.hidden, q),
                    p + LAYER_TENSORS["gate"]: (c.inter, c.hidden), p + LAYER_TENSORS["up"]: (c.inter, c.hidden),
                    p + LAYER_TENSORS["down"]: (c.hidden, c.inter)})
        if c.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)})
        if c.o_bias:
            out[p + "self_attn.o_proj.bias"] = (c.hidden,)
        if c.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)})
    return out


def random_weights(c: Config, seed: int) -> dict[str, np.ndarray]:
    """Seeded random weights of the config: norms near 1, projections scaled by their fan-in,
    so that random prompts give spread logits."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(c).items():
        if name.endswith("norm.weight"):
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            out[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)
    return out


def load_weights(weights_dir: str, c: Config, seed: int) -> dict[str, np.ndarray]:
    """The checkpoint's tensors (float32), or seeded random weights when weights_dir holds no
    safetensors. A missing tensor is an error that names it."""
    if not glob.glob(os.path.join(weights_dir, "*.safetensors")):
        print(f"{NAME}: {weights_dir} holds no *.safetensors: seeded random weights (seed {seed}) of its config.json", file=sys.stderr)
        return random_weights(c, seed)
    t = load_dir(weights_dir)
    for name, shape in tensor_shapes(c).items():
        if name not in t:
            raise ValueError(f"{weights_dir}: tensor {name} is missing")
        if tuple(t[name].shape) != shape:
            raise ValueError(f"{weights_dir}: tensor {name} has shape {tuple(t[name].shape)}, the config needs {shape}")
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x: [..., dim]; the mean of squares in float64, as the Go reference does."""
    ms = np.mean(np.square(x.astype(np.float64)), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)) * w


class Model(Runner):
    """The runner: info() describes the model and its cache to the engine, execute(plan)
    runs one step."""

    def __init__(self, weights_dir: str, page_tokens: int = 16, max_context: int = 0, seed: int = 1):
        with open(os.path.join(weights_dir, "config.json")) as f:
            self.c = c = Config(json.load(f))
        self.page_tokens = page_tokens
        self.max_context = max_context or min(c.max_pos, 4096)
        self.w = w = load_weights(weights_dir, c, seed)
        self.embed = w["model.embed_tokens.weight"]
        self.head = w.get("lm_head.weight", self.embed) if c.tie else w["lm_head.weight"]
        self.norm = w["model.norm.weight"]
        self.L = []
        for i in range(c.layers):
            p = f"model.layers.{i}."
            lw = {k: w[p + n] for k, n in LAYER_TENSORS.items()}
            for k in ("q", "k", "v", "o"):
                lw[k + "_bias"] = w.get(p + f"self_attn.{k}_proj.bias")
            lw["q_norm"], lw["k_norm"] = w.get(p + "self_attn.q_norm.weight"), w.get(p + "self_attn.k_norm.weight")
            self.L.append(lw)
        ang = np.arange(self.max_context, dtype=np.float64)[:, None] * c.inv_freq()[None, :]
        self.cos, self.sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        # The paged cache: the engine's page ids map to rows of K/V, which grow on demand.
        # K[l], V[l]: [pages, page_tokens, kv_heads, head_dim].
        self.page_row: dict[int, int] = {}
        shape = (0, page_tokens, c.kv_heads, c.head_dim)
        self.K = [np.zeros(shape, np.float32) for _ in range(c.layers)]
        self.V = [np.zeros(shape, np.float32) for _ in range(c.layers)]

    def info(self) -> RunnerInfo:
        c = self.c
        # One full-attention group: K and V of every layer, float32.
        kv = wire.CacheGroup("kv", wire.KIND_FULL, c.layers, 2 * c.kv_heads * c.head_dim * 4, self.page_tokens)
        return RunnerInfo(NAME, c.vocab, self.max_context, [e for e in c.eos if 0 <= e < c.vocab], [kv])

    # --- the cache -----------------------------------------------------------------------

    def rows(self, pages) -> np.ndarray:
        """The K/V rows of the engine's page ids, adding rows for pages not seen yet."""
        out = np.empty(len(pages), dtype=np.int64)
        for j, p in enumerate(pages):
            p = int(p)
            if p == wire.NO_PAGE:
                raise StepFailed("a page table holds no page where full attention needs one")
            out[j] = self.page_row.setdefault(p, len(self.page_row))
        have = self.K[0].shape[0]
        if len(self.page_row) > have:
            pad = np.zeros((max(len(self.page_row), 2 * have, 16) - have,) + self.K[0].shape[1:], np.float32)
            self.K = [np.concatenate([k, pad]) for k in self.K]
            self.V = [np.concatenate([v, pad]) for v in self.V]
        return out

    def apply_cache_ops(self, ops):
        for op in ops:
            if op.kind != wire.OP_COPY_PAGE or op.group != 0:
                raise StepFailed(f"cache op kind {op.kind} on group {op.group}: this model has one full-attention group")
            src, dst = self.rows([op.src, op.dst])
            for l in range(self.c.layers):
                self.K[l][dst], self.V[l][dst] = self.K[l][src], self.V[l][src]

    # --- the forward ---------------------------------------------------------------------

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [T, heads, head_dim], rotated in NeoX halves."""
        h = self.c.head_dim // 2
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x[..., :h], x[..., h:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def forward(self, tokens, positions, slots, seqs, rows) -> np.ndarray:
        """Runs tokens (at positions) through the model, writing their K/V at slots, and
        returns the logits [len(rows), vocab] of the token rows named by rows. seqs lists
        (first row, end row, context length after the step, page ids) per sequence."""
        c, bt = self.c, self.page_tokens
        T = len(tokens)
        pos = np.asarray(positions, dtype=np.int64)
        if T and (pos.max() >= self.max_context or min(tokens) < 0 or max(tokens) >= c.vocab):
            raise StepFailed(f"a position beyond the context of {self.max_context} or a token outside the vocabulary")
        slots = np.asarray(slots, dtype=np.int64)
        if np.any(slots < 0):
            raise StepFailed("a token without a cache slot")
        slot_rows, slot_off = self.rows((slots // bt).tolist()), slots % bt
        tables = [self.rows(pages) for _, _, _, pages in seqs]
        nh, nkv, d = c.heads, c.kv_heads, c.head_dim
        x = self.embed[np.asarray(tokens, dtype=np.int64)]
        for l, lw in enumerate(self.L):
            h = rms_norm(x, lw["attn_norm"], c.eps)
            q, k, v = h @ lw["q"].T, h @ lw["k"].T, h @ lw["v"].T
            if c.qkv_bias:
                q, k, v = q + lw["q_bias"], k + lw["k_bias"], v + lw["v_bias"]
            q, k, v = q.reshape(T, nh, d), k.reshape(T, nkv, d), v.reshape(T, nkv, d)
            if c.qk_norm:
                q, k = rms_norm(q, lw["q_norm"], c.eps), rms_norm(k, lw["k_norm"], c.eps)
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.K[l][slot_rows, slot_off], self.V[l][slot_rows, slot_off] = k, v
            att = np.empty((T, nh, d), np.float32)
            for (a, b, ctx, _), pages in zip(seqs, tables):
                if len(pages) * bt < ctx:
                    raise StepFailed(f"a page table of {len(pages)} pages for {ctx} tokens")
                K = self.K[l][pages].reshape(-1, nkv, d)[:ctx]
                V = self.V[l][pages].reshape(-1, nkv, d)[:ctx]
                att[a:b] = attention(q[a:b], K, V, pos[a:b], c.window)
            o = att.reshape(T, nh * d) @ lw["o"].T
            if c.o_bias:
                o = o + lw["o_bias"]
            x = x + o
            h = rms_norm(x, lw["mlp_norm"], c.eps)
            g, u = h @ lw["gate"].T, h @ lw["up"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ lw["down"].T
        return rms_norm(x[rows], self.norm, c.eps) @ self.head.T

    def execute(self, plan: wire.Plan) -> wire.StepResult:
        if np.any(plan.num_drafts):
            raise StepFailed("this model proposes no drafts and verifies none")
        seqs = []
        for i in range(plan.num_seqs):
            a, b = int(plan.query_start[i]), int(plan.query_start[i + 1])
            seqs.append((a, b, int(plan.computed[i]) + b - a, plan.page_tables[0][i].tolist()))
        # Prompt logprobs score every prompt row; otherwise only the sampled rows.
        scoring = any(plan.prompt_rows(i) > 0 for i in range(plan.num_seqs))
        rows = np.arange(len(plan.tokens)) if scoring else plan.logits_indices
        logits = self.forward(plan.tokens.tolist(), plan.positions, plan.slot_mapping[0], seqs, rows)
        return sample_plan(plan, logits, all_rows=scoring)


def attention(q: np.ndarray, K: np.ndarray, V: np.ndarray, qpos: np.ndarray, window: int) -> np.ndarray:
    """Causal GQA attention of one sequence's queries q [n, heads, d] over its context K, V
    [ctx, kv_heads, d] (key j at position j); window > 0 keeps the last window keys."""
    nh, d = q.shape[1], q.shape[2]
    group = nh // K.shape[1]
    Kh = np.repeat(K, group, axis=1).transpose(1, 0, 2)  # [heads, ctx, d]
    Vh = np.repeat(V, group, axis=1).transpose(1, 0, 2)
    s = (q.transpose(1, 0, 2) @ Kh.transpose(0, 2, 1)).astype(np.float64) / math.sqrt(d)  # [heads, n, ctx]
    kpos = np.arange(K.shape[0])[None, :]
    mask = kpos > qpos[:, None]
    if window > 0:
        mask |= kpos <= qpos[:, None] - window
    s[:, mask] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return (p.astype(np.float32) @ Vh).transpose(1, 0, 2)
