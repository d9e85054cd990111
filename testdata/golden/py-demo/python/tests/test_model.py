"""Tests of the paged forward (model.py) against the naive one (reference.py): prefill,
token-by-token decode, batches, page layout, copy-on-write, and the weight loader.

    python -m unittest discover -s python/tests -t python
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import unittest

import numpy as np

from pydemo_runner.model import Model, tensor_shapes
from pydemo_runner.reference import greedy, naive_logits

from .tiny import tiny_config, write_config

PT = 4  # page tokens: small, so that sequences span several pages


def close(a, b, tol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b) / (1 + np.abs(b)))


class ModelTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.dir = write_config(self.tmp.name, tiny_config())

    def model(self, seed=7):
        return Model(self.dir, page_tokens=PT, seed=seed)

    def prompt(self, n, salt=0):
        return [(i * 37 + salt * 101 + 3) % 384 for i in range(n)]

    def prefill(self, m, tokens, pages, computed=0):
        """Runs tokens[computed:] of one sequence stored in pages; returns every row's logits."""
        n = len(tokens) - computed
        slots = [pages[p // PT] * PT + p % PT for p in range(computed, len(tokens))]
        return m.forward(tokens[computed:], list(range(computed, len(tokens))), slots,
                         [(0, n, len(tokens), pages)], np.arange(n))

    def test_prefill_matches_naive(self):
        m, toks = self.model(), self.prompt(11)
        got = self.prefill(m, toks, [5, 2, 9])
        self.assertLess(close(got, naive_logits(m, toks)), 1e-4)

    def test_decode_equals_prefill(self):
        m, toks = self.model(), self.prompt(11)
        want = self.prefill(self.model(), toks, [0, 1, 2])
        for t in range(len(toks)):
            got = self.prefill(m, toks[: t + 1], [3, 7, 4], computed=t)
            self.assertLess(close(got[-1], want[t]), 1e-4, f"position {t}")

    def test_batch_equals_alone(self):
        a, b = self.prompt(9, 1), self.prompt(6, 2)
        alone_a = self.prefill(self.model(), a, [0, 1, 2])
        alone_b = self.prefill(self.model(), b, [0, 1])
        m = self.model()
        slots = [[4, 5, 6][p // PT] * PT + p % PT for p in range(9)] + [[7, 8][p // PT] * PT + p % PT for p in range(6)]
        got = m.forward(a + b, list(range(9)) + list(range(6)), slots, [(0, 9, 9, [4, 5, 6]), (9, 15, 6, [7, 8])], np.arange(15))
        self.assertLess(close(got[:9], alone_a), 1e-4)
        self.assertLess(close(got[9:], alone_b), 1e-4)

    def test_copy_on_write(self):
        """A page copied by a cache op serves a sequence as the original did."""
        from resin_runner import wire

        m, toks = self.model(), self.prompt(8)
        want = self.prefill(m, toks + [11], [0, 1, 2])[-1]
        m.apply_cache_ops([wire.CacheOp(wire.OP_COPY_PAGE, 0, 1, 6)])
        got = self.prefill(m, toks + [11], [0, 6, 2], computed=8)[-1]
        self.assertLess(close(got, want), 1e-4)

    def test_greedy_is_reproducible(self):
        m = self.model()
        self.assertEqual(greedy(m, [1, 2, 3, 4], 6), greedy(self.model(), [1, 2, 3, 4], 6))
        self.assertNotEqual(greedy(self.model(seed=8), [1, 2, 3, 4], 6), [], "greedy gave nothing")

    def test_loads_safetensors_and_names_a_missing_tensor(self):
        m = self.model()
        save_safetensors(os.path.join(self.dir, "model.safetensors"), m.w)
        back = Model(self.dir, page_tokens=PT, seed=99)  # the file, not seed 99's weights
        toks = self.prompt(5)
        self.assertLess(close(naive_logits(back, toks), naive_logits(m, toks)), 1e-12)
        name = sorted(tensor_shapes(m.c))[0]
        save_safetensors(os.path.join(self.dir, "model.safetensors"), {k: v for k, v in m.w.items() if k != name})
        with self.assertRaisesRegex(ValueError, name.replace(".", r"\.")):
            Model(self.dir, page_tokens=PT)


def save_safetensors(path: str, tensors: dict[str, np.ndarray]):
    """Writes float32 tensors as safetensors (header length, JSON header, data)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


if __name__ == "__main__":
    unittest.main()
