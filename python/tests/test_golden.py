"""The Python codec against the Go fixtures (core/wire/testdata): every message kind
decodes to the values recorded beside it, and the runner-side encoders (info, result,
error) and hello/shutdown reproduce the fixtures' bytes."""

import io
import json
import os
import struct
import unittest

import numpy as np

from resin_runner import wire

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.environ.get("RESIN_WIRE_TESTDATA", os.path.join(HERE, "..", "..", "core", "wire", "testdata"))


def fixture(name):
    with open(os.path.join(TESTDATA, name + ".bin"), "rb") as f:
        raw = f.read()
    with open(os.path.join(TESTDATA, name + ".json")) as f:
        want = json.load(f)
    return raw, want


def payload_of(raw, kind):
    k, payload = wire.read_frame(io.BytesIO(raw))
    assert k == kind, (k, kind)
    return payload


def plain(v):
    if isinstance(v, np.ndarray):
        return [plain(x) for x in v.tolist()]
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, float):
        return float(np.float32(v))
    return v


class Golden(unittest.TestCase):
    def test_hello(self):
        raw, want = fixture("hello")
        h = wire.decode_hello(payload_of(raw, wire.KIND_HELLO))
        self.assertEqual((h.version, h.max_frame, h.caps), (want["version"], want["max_frame"], want["caps"]))
        self.assertEqual(wire.encode_hello(h), raw)

    def test_info(self):
        raw, want = fixture("info")
        caps, info = wire.decode_info(payload_of(raw, wire.KIND_INFO))
        self.assertEqual(caps, want["caps"])
        self.assertEqual(info.name, want["name"])
        self.assertEqual((info.vocab_size, info.max_context, info.max_drafts, info.async_tokens),
                         (want["vocab_size"], want["max_context"], want["max_drafts"], want["async_tokens"]))
        self.assertEqual(info.eos, want["eos"])
        self.assertEqual(info.graph_buckets, want["graph_buckets"])
        self.assertEqual([g.__dict__ for g in info.cache_groups], want["cache_groups"])
        self.assertEqual(wire.encode_info(info, caps), raw)

    def test_steps(self):
        tables = wire.Tables()
        for name in ("step1", "step2"):
            raw, want = fixture(name)
            plan = tables.decode_step(payload_of(raw, wire.KIND_STEP))
            for key, value in want.items():
                if key == "cache_ops":
                    got = [o.__dict__ for o in plan.cache_ops]
                elif key == "released":
                    got = [r.__dict__ for r in plan.released]
                else:
                    got = plain(getattr(plan, key))
                want_v = value
                if key in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias_values"):
                    want_v = [float(np.float32(x)) for x in value]
                self.assertEqual(got, want_v, f"{name}: {key}")
        self.assertEqual(sorted(tables.by_req), [9, 11])

    def test_token_mask_sampling(self):
        # step2's second sequence is constrained: its mask allows tokens 64, 95 and 96..104.
        from resin_runner.sampling import sample_plan
        tables = wire.Tables()
        tables.decode_step(payload_of(fixture("step1")[0], wire.KIND_STEP))
        plan = tables.decode_step(payload_of(fixture("step2")[0], wire.KIND_STEP))
        self.assertIsNone(plan.token_mask_of(0))
        allowed = [64, 95] + list(range(96, 105))
        rng = np.random.default_rng(0)
        for _ in range(20):
            logits = rng.standard_normal((2, 128)).astype(np.float32)
            res = sample_plan(plan, logits)
            want = allowed[int(np.argmax(logits[1][allowed]))]  # greedy (temperature 0)
            self.assertEqual(res.tokens[1], want)

    def test_result(self):
        raw, want = fixture("result")
        step, res = wire.decode_result(payload_of(raw, wire.KIND_RESULT))
        self.assertEqual(step, want["step"])
        for name, _ in wire.StepResult._ORDER:
            self.assertEqual(getattr(res, name), plain(want[name]), name)
        self.assertEqual(wire.encode_result(step, res), raw)

    def test_error(self):
        raw, want = fixture("error")
        step, code, msg = wire.decode_error(payload_of(raw, wire.KIND_ERROR))
        self.assertEqual((step, code, msg), (want["step"], want["code"], want["message"]))
        self.assertEqual(wire.encode_error(step, code, msg), raw)

    def test_shutdown(self):
        raw, _ = fixture("shutdown")
        self.assertEqual(payload_of(raw, wire.KIND_SHUTDOWN), b"")
        self.assertEqual(wire.encode_shutdown(), raw)


class Malformed(unittest.TestCase):
    def test_truncated_steps_raise_wire_errors(self):
        raw, _ = fixture("step2")
        payload = payload_of(raw, wire.KIND_STEP)
        for n in range(len(payload)):
            tables = wire.Tables()
            tables.decode_step(payload_of(fixture("step1")[0], wire.KIND_STEP))
            with self.assertRaises(wire.WireError, msg=f"cut at {n}"):
                tables.decode_step(payload[:n])

    def test_oversize_frame(self):
        with self.assertRaisesRegex(wire.WireError, "limit"):
            wire.read_frame(io.BytesIO(struct.pack("<IB", 1 << 30, 3)), max_frame=1 << 20)

    def test_wrong_version(self):
        raw, _ = fixture("hello")
        p = bytearray(payload_of(raw, wire.KIND_HELLO))
        p[4] = 9
        with self.assertRaisesRegex(wire.WireError, "version"):
            wire.decode_hello(bytes(p))


if __name__ == "__main__":
    unittest.main()
