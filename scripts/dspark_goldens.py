"""DSpark drafter goldens: tiny random DeepSpec drafters and what DeepSpec's own code drafts.

The drafter below is a minimal port of DeepSeek's DeepSpec (MIT, deepseek-ai/DeepSpec), kept
as close to the original as the eval path allows; each piece names where it comes from.
It is built on transformers' Qwen3 modules exactly as DeepSpec imports them, saved with
save_pretrained (the directory layout Resin loads), and driven through DeepSpec's
evaluation loop for a few verifications with given target features. Only the sampling
differs: torch.multinomial is replaced by the inverse CDF over recorded uniforms (the same
distribution), so the Go side can replay the draws.

    .cache/torch-venv/bin/python scripts/dspark_goldens.py core/dspark/testdata
    .cache/torch-venv/bin/python scripts/dspark_goldens.py --e2e models/llama/testdata/dspark

The second form also builds a tiny seeded Qwen3 target (transformers' Qwen3ForCausalLM)
and runs DeepSpec's whole greedy decoding loop (generate_decoding_sample with
verify_draft_tokens, the target's hidden_states tapped by extract_context_feature) and
records one trace line per verification and the output tokens.
"""

import json
import os
import sys

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)


# deepspec/utils/sampling.py: logits_to_probs; sample_tokens with multinomial replaced by
# the inverse CDF over a given uniform.
def logits_to_probs(logits, temperature):
    if temperature < 1e-5:
        probs = torch.zeros_like(logits, dtype=torch.float32)
        probs.scatter_(-1, torch.argmax(logits, dim=-1, keepdim=True), 1.0)
        return probs
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample_tokens(logits, temperature, uniform):
    """logits [batch, vocab] -> [batch]"""
    if temperature < 1e-5:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1).double()
    cum = probs.cumsum(-1)
    idx = int((cum <= uniform).sum().item())
    return torch.tensor([min(idx, logits.size(-1) - 1)])


# deepspec/modeling/dspark/qwen3/modeling.py: apply_rotary_pos_emb, Qwen3DSparkAttention,
# Qwen3DSparkDecoderLayer, Qwen3DSparkModel (its eval-path parts: __init__, compute_logits,
# predict_confidence_step, _forward_backbone).
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_len = q.size(-2)
    q_embed = (q * cos[..., -q_len:, :]) + (rotate_half(q) * sin[..., -q_len:, :])
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class Qwen3DSparkAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_attention_heads // self.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        b = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_attention_heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=b)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.num_attention_heads * self.head_dim, config.hidden_size, bias=b)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, target_hidden_states, position_embeddings, past_key_values=None):
        bsz, q_len = hidden_states.shape[:-1]
        ctx_len = target_hidden_states.shape[1]
        q = self.q_proj(hidden_states).view(bsz, q_len, self.num_attention_heads, self.head_dim)
        q = self.q_norm(q).transpose(1, 2)
        k_ctx = self.k_proj(target_hidden_states)
        k_noise = self.k_proj(hidden_states)
        v_ctx = self.v_proj(target_hidden_states)
        v_noise = self.v_proj(hidden_states)
        k = torch.cat([k_ctx, k_noise], dim=1).view(bsz, ctx_len + q_len, self.num_key_value_heads, self.head_dim)
        v = torch.cat([v_ctx, v_noise], dim=1).view(bsz, ctx_len + q_len, self.num_key_value_heads, self.head_dim)
        k = self.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx, {"sin": sin, "cos": cos})
        # DeepSpec's eval runs sdpa with attention_mask None and is_causal False; eager is
        # the same math.
        attn_output, _ = eager_attention_forward(self, q, k, v, None, dropout=0.0, scaling=self.scaling)
        attn_output = attn_output.reshape(bsz, q_len, self.num_attention_heads * self.head_dim)
        return self.o_proj(attn_output)


class Qwen3DSparkDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = Qwen3DSparkAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, target_hidden_states, hidden_states, position_embeddings, past_key_value):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, target_hidden_states, position_embeddings, past_key_value)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.mlp(hidden_states)


# deepspec/modeling/dspark/common.py: AcceptRatePredictor.
class AcceptRatePredictor(nn.Module):
    def __init__(self, input_dim):
        super().__init__()
        self.proj = nn.Linear(int(input_dim), 1)

    def forward(self, features):
        return self.proj(features).squeeze(-1)


# deepspec/modeling/dspark/markov_head.py: VanillaMarkov, GatedMarkovHead, RNNHead and their
# sample_block_tokens (the eval path), sampling through sample_tokens above.
class VanillaMarkov(nn.Module):
    def __init__(self, vocab_size, markov_rank):
        super().__init__()
        self.markov_rank = markov_rank
        self.markov_w1 = nn.Embedding(vocab_size, markov_rank)
        self.markov_w2 = nn.Linear(markov_rank, vocab_size, bias=False)

    def get_prev_embeddings(self, token_ids):
        return self.markov_w1(token_ids.long())

    def compute_step_bias(self, token_ids, hidden_states):
        return self.markov_w2(self.get_prev_embeddings(token_ids))

    def sample_block_tokens(self, base_logits, first_prev_token_ids, hidden_states, temperature, uniforms):
        sampled, corrected = [], []
        prev = first_prev_token_ids.long()
        for i in range(base_logits.shape[1]):
            step_logits = base_logits[:, i, :] + self.compute_step_bias(prev, hidden_states[:, i, ...])
            corrected.append(step_logits.unsqueeze(1))
            prev = sample_tokens(step_logits, temperature, uniforms[i])
            sampled.append(prev)
        return torch.stack(sampled, dim=1), torch.cat(corrected, dim=1)


class GatedMarkovHead(VanillaMarkov):
    def __init__(self, vocab_size, markov_rank, hidden_size):
        super().__init__(vocab_size, markov_rank)
        self.gate_proj = nn.Linear(hidden_size + markov_rank, markov_rank)

    def compute_step_bias(self, token_ids, hidden_states):
        prev_embeddings = self.get_prev_embeddings(token_ids)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden_states, prev_embeddings], dim=-1)))
        return self.markov_w2(gate * prev_embeddings)


class RNNHead(VanillaMarkov):
    def __init__(self, vocab_size, markov_rank, hidden_size):
        super().__init__(vocab_size, markov_rank)
        self.joint_proj = nn.Linear(2 * markov_rank + hidden_size, 3 * markov_rank)

    def _rnn_step(self, state, prev_embeddings, hidden_states):
        proj = self.joint_proj(torch.cat([state, prev_embeddings, hidden_states], dim=-1))
        gate_raw, candidate_raw, output_raw = proj.chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        new_state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
        return new_state, self.markov_w2(torch.tanh(output_raw))

    def sample_block_tokens(self, base_logits, first_prev_token_ids, hidden_states, temperature, uniforms):
        state = torch.zeros(base_logits.shape[0], self.markov_rank, dtype=hidden_states.dtype)
        sampled, corrected = [], []
        prev = first_prev_token_ids.long()
        for i in range(base_logits.shape[1]):
            state, bias = self._rnn_step(state, self.get_prev_embeddings(prev), hidden_states[:, i, :])
            step_logits = base_logits[:, i, :] + bias
            corrected.append(step_logits.unsqueeze(1))
            prev = sample_tokens(step_logits, temperature, uniforms[i])
            sampled.append(prev)
        return torch.stack(sampled, dim=1), torch.cat(corrected, dim=1)


def build_markov_head(config):
    if int(config.markov_rank) == 0:
        return None
    kind = str(config.markov_head_type).lower()
    if kind == "vanilla":
        return VanillaMarkov(config.vocab_size, config.markov_rank)
    if kind == "gated":
        return GatedMarkovHead(config.vocab_size, config.markov_rank, config.hidden_size)
    if kind == "rnn":
        return RNNHead(config.vocab_size, config.markov_rank, config.hidden_size)
    raise ValueError(kind)


class Qwen3DSparkModel(Qwen3PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.target_layer_ids = config.target_layer_ids
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Qwen3DSparkDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.block_size = int(config.block_size)
        self.mask_token_id = config.mask_token_id
        self.markov_head = build_markov_head(config)
        self.confidence_head_with_markov = bool(config.enable_confidence_head) and bool(config.confidence_head_with_markov)
        self.confidence_head = None
        if config.enable_confidence_head:
            input_dim = config.hidden_size + (config.markov_rank if self.confidence_head_with_markov else 0)
            self.confidence_head = AcceptRatePredictor(input_dim)
        self.post_init()

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)

    def predict_confidence_step(self, hidden_states, prev_token_ids):
        if self.confidence_head is None:
            return None
        if self.confidence_head_with_markov:
            prev = self.markov_head.get_prev_embeddings(prev_token_ids).to(dtype=hidden_states.dtype)
            return self.confidence_head(torch.cat([hidden_states, prev], dim=-1)).float()
        return self.confidence_head(hidden_states).float()

    def _forward_backbone(self, position_ids, noise_embedding, target_hidden_states, past_key_values):
        hidden_states = noise_embedding
        target_hidden_states = self.hidden_norm(self.fc(target_hidden_states))
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(target_hidden_states, hidden_states, position_embeddings, past_key_values)
        return self.norm(hidden_states)


# deepspec/eval/dspark/draft_ops.py: forward_dspark_draft_block, build_dspark_proposal
# (with _confident_prefix_length).
def forward_dspark_draft_block(model, draft_input_ids, position_ids, cache, target_hidden_states, start, block_size):
    draft_position_ids = position_ids[:, cache.get_seq_length() : start + block_size]
    block_hidden = model._forward_backbone(draft_position_ids, model.embed_tokens(draft_input_ids), target_hidden_states, cache)
    # DeepSpec calls cache.crop(start) (keep `start` positions); transformers 5.23's crop takes
    # the negative number of positions to drop instead.
    extra = cache.get_seq_length() - start
    if extra > 0:
        cache.crop(-extra)
    return block_hidden


def build_dspark_proposal(model, draft_input_ids, block_hidden, block_size, temperature, threshold, uniforms):
    hidden = block_hidden[:, :block_size, :]
    base_logits = model.compute_logits(hidden)
    if model.markov_head is None:
        logits = base_logits
        sampled = torch.stack([sample_tokens(base_logits[:, i, :], temperature, uniforms[i]) for i in range(block_size)], dim=1)
    else:
        sampled, logits = model.markov_head.sample_block_tokens(base_logits, draft_input_ids[:, 0], hidden, temperature, uniforms)
    n = block_size
    conf = None
    if model.confidence_head is not None:
        prev = torch.cat([draft_input_ids[:, :1], sampled[:, :-1]], dim=1)
        conf = model.predict_confidence_step(hidden, prev)[0]
        if threshold > 0.0:
            below = (conf.sigmoid() < threshold).nonzero()
            if below.numel() > 0:
                n = int(below[0].item())
    q = logits_to_probs(logits[:, :n, :], temperature)
    return sampled[0], logits[0], conf, n, q[0]


VARIANTS = [
    # name, markov type, rank, confidence, confidence_with_markov, block, taps, attention_bias
    ("vanilla", "vanilla", 6, True, True, 7, [-1, 1, 2], False),
    ("gated", "gated", 6, True, False, 4, [0, 2], True),
    ("rnn", "rnn", 6, True, True, 5, [-1, 2], False),
    ("plain", None, 0, False, False, 6, [1], False),
]
RUNS = [(0.0, 0.0), (0.0, 0.5), (0.8, 0.5)]  # (temperature, confidence threshold)
ACCEPT = [2, 0, 9, 1]  # accepted drafts per verification (capped at the drafts proposed)
VOCAB, HIDDEN, TARGET_LAYERS, PROMPT = 32, 16, 4, 5


def make_drafter(name, kind, rank, conf, conf_markov, block, taps, bias, seed):
    c = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=bias,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    # deepspec/modeling/dspark/qwen3/config.py build_draft_config
    c.architectures = ["Qwen3DSparkModel"]
    c.num_target_layers = TARGET_LAYERS
    c.block_size = block
    c.layer_types = ["full_attention"] * c.num_hidden_layers
    c.mask_token_id = VOCAB - 1
    c.target_layer_ids = taps
    c.num_anchors = 8
    c.enable_confidence_head = conf
    if conf:
        c.confidence_head_with_markov = conf_markov
    c.markov_rank = rank
    if rank > 0:
        c.markov_head_type = kind
    c._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = Qwen3DSparkModel(c).float().eval()
    with torch.no_grad():  # weights large enough for the drafts and cuts to vary
        for pname, p in m.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn_like(p))
            elif "markov_w1" in pname:
                p.copy_(0.4 * torch.randn_like(p))
            elif "embed" in pname:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return m


def r6(t):
    return [float("%.6g" % v) for v in t.reshape(-1).tolist()]


@torch.inference_mode()
def run(model, temperature, threshold, gen):
    """deepspec/eval/base_evaluator.py generate_decoding_sample, with target features and
    verification outcomes given instead of a target model."""
    B, F = model.block_size, len(model.target_layer_ids) * HIDDEN
    position_ids = torch.arange(64).unsqueeze(0)
    cache = DynamicCache()
    feats = torch.randn(1, PROMPT, F, generator=gen)
    anchor = int(torch.randint(0, VOCAB - 1, (1,), generator=gen))
    start, steps = PROMPT, []
    for accept in ACCEPT:
        uniforms = torch.rand(B, generator=gen, dtype=torch.float64).tolist()
        ids = torch.full((1, B), model.mask_token_id, dtype=torch.long)
        ids[0, 0] = anchor
        step = {"anchor": anchor, "anchor_position": start, "features": r6(feats[0]), "uniforms": uniforms}
        hidden = forward_dspark_draft_block(model, ids, position_ids, cache, feats, start, B)
        chain, logits, conf, n, q = build_dspark_proposal(model, ids, hidden, B, temperature, threshold, uniforms)
        a = min(accept, n)
        step.update({
            "logits": r6(logits), "chain": chain.tolist(), "drafts": n,
            "confidence": r6(conf) if conf is not None else None, "accepted": a,
            "q": r6(q) if temperature >= 1e-5 else None,  # one-hot when greedy
        })
        steps.append(step)
        # _update: the context grows by the anchor's and the accepted drafts' features.
        feats = torch.randn(1, a + 1, F, generator=gen)
        anchor = int(torch.randint(0, VOCAB - 1, (1,), generator=gen))
        start += a + 1
    return steps


def crop_to(cache, n):
    """DeepSpec's cache.crop(n) (keep n positions) on transformers 5.23's crop."""
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


# deepspec/modeling/dspark/common.py: extract_context_feature.
def extract_context_feature(hidden_states, layer_ids):
    return torch.cat([hidden_states[0 if l == -1 else l + 1] for l in layer_ids], dim=-1)


@torch.inference_mode()
def decode(target, drafter, prompt, max_new_tokens, threshold):
    """deepspec/eval/base_evaluator.py generate_decoding_sample and verify_draft_tokens at
    temperature 0 (target_probs one-hot, so a draft is accepted iff it is the target's
    argmax; the residual of a rejection and the bonus token are the argmax too), with
    deepspec/eval/dspark/evaluator.py's _init_context, _propose and _update."""
    B = drafter.block_size
    input_ids = torch.tensor([prompt])
    n = len(prompt)
    max_length = n + max_new_tokens
    output_ids = torch.zeros((1, max_length + B + 1), dtype=torch.long)
    position_ids = torch.arange(output_ids.shape[1]).unsqueeze(0)
    cache_t = DynamicCache()
    out = target(input_ids=input_ids, position_ids=position_ids[:, :n], past_key_values=cache_t, use_cache=True, output_hidden_states=True)
    output_ids[:, :n] = input_ids
    output_ids[0, n] = int(out.logits[0, -1].argmax())
    cache_d = DynamicCache()
    feats = extract_context_feature(out.hidden_states, drafter.target_layer_ids)
    start, trace = n, []
    while start < max_length:
        ids = torch.full((1, B), drafter.mask_token_id, dtype=torch.long)
        ids[0, 0] = output_ids[0, start]
        hidden = forward_dspark_draft_block(drafter, ids, position_ids, cache_d, feats, start, B)
        chain, _, _, k, _ = build_dspark_proposal(drafter, ids, hidden, B, 0.0, threshold, [0.0] * B)
        verify = torch.cat([ids[:, :1], chain[:k].unsqueeze(0)], dim=1)
        tout = target(input_ids=verify, position_ids=position_ids[:, start : start + k + 1], past_key_values=cache_t, use_cache=True, output_hidden_states=True)
        best = tout.logits[0].argmax(-1)
        a = 0
        while a < k and int(verify[0, a + 1]) == int(best[a]):
            a += 1
        nxt = int(best[a])
        trace.append({"anchor_position": start, "drafts": chain[:k].tolist(), "accepted": a, "next": nxt})
        output_ids[0, start : start + a + 1] = verify[0, : a + 1]
        output_ids[0, start + a + 1] = nxt
        start += a + 1
        crop_to(cache_t, start)
        feats = extract_context_feature(tout.hidden_states, drafter.target_layer_ids)[:, : a + 1, :]
    return output_ids[0, n:max_length].tolist(), trace


E2E_DRAFTERS = [
    # name, markov type, rank, confidence, with markov, block, taps
    ("vanilla", "vanilla", 6, True, True, 4, [-1, 1, 2]),
    ("rnn", "rnn", 6, True, False, 5, [0, 2]),
]
E2E_PROMPTS = [[1, 2, 3, 4], [7, 7], [5, 9, 11, 2, 6, 8, 3]]


def e2e(out):
    """A target, drafters that share its embeddings and head (DeepSpec's
    initialize_embeddings_and_head), and traces of DeepSpec's loop."""
    vocab = 16
    tc = Qwen3Config(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    tc.architectures = ["Qwen3ForCausalLM"]
    tc._attn_implementation = "eager"
    torch.manual_seed(100)
    target = Qwen3ForCausalLM(tc).float().eval()
    with torch.no_grad():
        for pname, p in target.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "embed" in pname:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    target.save_pretrained(os.path.join(out, "target"))
    global VOCAB
    VOCAB = vocab
    cases = []
    for name, kind, rank, conf, conf_markov, block, taps in E2E_DRAFTERS:
        # Seeds are tried until the traces hold zero, partial and full acceptance.
        for seed in range(200):
            m = make_drafter(name, kind, rank, conf, conf_markov, block, taps, False, seed=seed)
            with torch.no_grad():
                m.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
                m.lm_head.weight.copy_(target.lm_head.weight)
            runs = []
            for threshold in (0.0, 0.5):
                for i, prompt in enumerate(E2E_PROMPTS):
                    tokens, trace = decode(target, m, prompt, 24, threshold)
                    runs.append({"drafter": name, "threshold": threshold, "prompt": prompt, "tokens": tokens,
                                 "trace": [dict(t, request=i) for t in trace]})
            acc = [(len(t["drafts"]), t["accepted"]) for r in runs for t in r["trace"]]
            if any(a == 0 and k > 0 for k, a in acc) and any(0 < a < k for k, a in acc) and any(a == k == block for k, a in acc):
                break
        else:
            raise SystemExit(f"no seed gives zero, partial and full acceptance for {name}")
        m.save_pretrained(os.path.join(out, name))
        cases += runs
        print(name, "seed", seed, "verifications", len(acc), "accepted", sum(a for _, a in acc), "of", sum(k for k, _ in acc))
    with open(os.path.join(out, "trace.json"), "w") as f:
        json.dump({"max_new_tokens": 24, "cases": cases}, f, separators=(",", ":"))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--e2e":
        e2e(sys.argv[2] if len(sys.argv) > 2 else "models/llama/testdata/dspark")
        return
    out = sys.argv[1] if len(sys.argv) > 1 else "core/dspark/testdata"
    cases = []
    for seed, v in enumerate(VARIANTS):
        m = make_drafter(*v, seed=seed)
        d = os.path.join(out, v[0])
        m.save_pretrained(d)
        for temperature, threshold in RUNS:
            gen = torch.Generator().manual_seed(1000 + seed)
            cases.append({"drafter": v[0], "temperature": temperature, "threshold": threshold, "steps": run(m, temperature, threshold, gen)})
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
    print("wrote", len(cases), "cases to", out)


if __name__ == "__main__":
    main()
