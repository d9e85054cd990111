"""Parity with transformers: the model's logits equal those of the transformers
implementation of its architecture on the same weights (fp32 CPU, every position of a
prompt). Skipped when torch or transformers cannot be imported; install them with
`pip install -e './python[parity]'` (or point RESIN_TORCH_PYTHON at an interpreter that has
them, for `go test -run TestTransformersParity`).
"""

from __future__ import annotations

import tempfile
import unittest

import numpy as np

from pydemo_runner.model import Model

from .tiny import tiny_config, write_config

try:
    import torch
    import transformers
except ImportError as e:  # the test says why it skips
    torch = None
    missing = str(e)


@unittest.skipIf(torch is None, "torch and transformers are needed for the parity test: pip install -e './python[parity]'")
class TransformersParityTest(unittest.TestCase):
    def test_logits_match(self):
        with tempfile.TemporaryDirectory() as d:
            raw = tiny_config(window=4096)
            write_config(d, raw)
            m = Model(d, page_tokens=4, seed=7)
            cfg = transformers.AutoConfig.from_pretrained(d)
            cfg._attn_implementation = "eager"
            hf = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
            state = {k: torch.from_numpy(np.array(v)) for k, v in m.w.items()}
            missing, unexpected = hf.load_state_dict(state, strict=False)
            self.assertEqual(unexpected, [], "tensors transformers does not know")
            self.assertTrue(set(missing) <= {"lm_head.weight"} and (not missing or raw.get("tie_word_embeddings")),
                            f"tensors the model did not give transformers: {missing}")
            toks = [(i * 37 + 3) % raw["vocab_size"] for i in range(13)]
            with torch.no_grad():
                want = hf(torch.tensor([toks])).logits[0].double().numpy()
            n = len(toks)
            got = m.forward(toks, list(range(n)), list(range(n)), [(0, n, n, list(range((n + 3) // 4)))], np.arange(n))
            err = np.max(np.abs(got - want) / (1 + np.abs(want)))
            self.assertLess(err, 1e-4, f"max relative difference {err:.2e} from transformers {transformers.__version__}")


if __name__ == "__main__":
    unittest.main()
