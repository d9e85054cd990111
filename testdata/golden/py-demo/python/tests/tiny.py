"""The scaffold's config.json shrunk to a size the tests run in a blink, keeping the
variant (model type, GQA ratio, biases, tied head, rope scaling, window)."""

from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "config.json")


def tiny_config(window: int = 5) -> dict:
    with open(CONFIG) as f:
        raw = json.load(f)
    heads, kv = raw["num_attention_heads"], raw.get("num_key_value_heads") or raw["num_attention_heads"]
    raw.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2,
               num_attention_heads=2 * min(heads // kv, 4), head_dim=16, vocab_size=min(raw["vocab_size"], 384))
    if raw.get("sliding_window"):
        raw["sliding_window"] = window  # short enough that the tests cross it
    return raw


def write_config(d: str, raw: dict) -> str:
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(raw, f)
    return d
