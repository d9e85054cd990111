"""Mutated and random inputs make the decoders raise WireError, never another exception,
and the serve loop answers a protocol error instead of crashing."""

import io
import random
import struct
import unittest

from resin_runner import wire
from resin_runner.runner import Runner, StepFailed, serve

from .test_golden import fixture, payload_of


class Mutations(unittest.TestCase):
    def test_mutated_steps(self):
        rng = random.Random(1)
        first = payload_of(fixture("step1")[0], wire.KIND_STEP)
        base = payload_of(fixture("step2")[0], wire.KIND_STEP)
        for _ in range(3000):
            b = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(b))
                b[i] = rng.choice([0, 0xFF, rng.randrange(256), b[i] ^ (1 << rng.randrange(8))])
            tables = wire.Tables()
            tables.decode_step(first)
            try:
                plan = tables.decode_step(bytes(b))
            except wire.WireError:
                continue
            self.assertEqual(len(plan.page_tables[0]), plan.num_seqs)

    def test_mutated_messages(self):
        rng = random.Random(2)
        decoders = {"info": wire.decode_info, "result": wire.decode_result, "error": wire.decode_error, "hello": wire.decode_hello}
        kinds = {"info": wire.KIND_INFO, "result": wire.KIND_RESULT, "error": wire.KIND_ERROR, "hello": wire.KIND_HELLO}
        for name, dec in decoders.items():
            base = payload_of(fixture(name)[0], kinds[name])
            for _ in range(1500):
                b = bytearray(base)
                i = rng.randrange(len(b))
                b[i] = rng.randrange(256)
                cut = rng.choice([len(b), rng.randrange(len(b) + 1)])
                try:
                    dec(bytes(b[:cut]))
                except wire.WireError:
                    pass


class Echo(Runner):
    def info(self):
        return wire.RunnerInfo("echo", 100, 64, [2], [wire.CacheGroup("kv", wire.KIND_FULL, 1, 4, 16)])

    def execute(self, plan):
        if plan.step == 2:
            raise StepFailed("no step 2 today")
        r = wire.StepResult(num_next_drafts=[0] * plan.num_seqs)
        for i in range(plan.num_seqs):
            lo, hi = plan.logits_start[i], plan.logits_start[i + 1]
            r.accepted.append(1 if hi > lo else 0)
            if hi > lo:
                r.tokens.append(int(plan.tokens[plan.logits_indices[hi - 1]]))
        return r


def frames(b: bytes):
    s = io.BytesIO(b)
    out = []
    while (f := wire.read_frame(s)) is not None:
        out.append(f)
    return out


class ServeLoop(unittest.TestCase):
    def run_loop(self, inp: bytes):
        out = io.BytesIO()
        code = serve(Echo(), io.BytesIO(inp), out)
        return code, frames(out.getvalue())

    def test_session(self):
        hello = wire.encode_hello(wire.Hello())
        step1, step2 = fixture("step1")[0], fixture("step2")[0]
        code, got = self.run_loop(hello + step1 + step2 + wire.encode_shutdown())
        self.assertEqual(code, 0)
        self.assertEqual([k for k, _ in got], [wire.KIND_INFO, wire.KIND_RESULT, wire.KIND_ERROR])
        step, res = wire.decode_result(got[1][1])
        self.assertEqual((step, res.tokens), (1, [13, 99]))
        # Step 2 carries a page copy, which a runner without a cache refuses (its requests
        # fail, the session goes on).
        step, code_, msg = wire.decode_error(got[2][1])
        self.assertEqual((step, code_), (2, wire.CODE_STEP_FAILED))
        self.assertIn("cache operations", msg)

    def test_wrong_version(self):
        h = bytearray(wire.encode_hello(wire.Hello()))
        struct.pack_into("<H", h, 9, 7)
        code, got = self.run_loop(bytes(h))
        self.assertEqual(code, 2)
        self.assertEqual(got[0][0], wire.KIND_ERROR)
        self.assertIn("version", wire.decode_error(got[0][1])[2])

    def test_step_before_hello(self):
        code, got = self.run_loop(fixture("step1")[0])
        self.assertEqual(code, 2)
        self.assertEqual(wire.decode_error(got[0][1])[1], wire.CODE_PROTOCOL)

    def test_oversize_frame(self):
        code, got = self.run_loop(wire.encode_hello(wire.Hello()) + struct.pack("<IB", 1 << 31, 3))
        self.assertEqual(code, 2)
        self.assertIn("limit", wire.decode_error(got[-1][1])[2])


    def test_result_over_the_engines_limit(self):
        # The engine's max frame (from Hello) holds for results too: a result it would
        # refuse (and close the session over) becomes a failed step.
        class Chatty(Echo):
            def execute(self, plan):
                r = super().execute(plan)
                r.top_tokens, r.top_logprobs = [1] * 200, [0.0] * 200
                return r

        out = io.BytesIO()
        hello = wire.encode_hello(wire.Hello(max_frame=400))
        code = serve(Chatty(), io.BytesIO(hello + fixture("step1")[0]), out)
        got = frames(out.getvalue())
        self.assertEqual(code, 0)
        self.assertEqual([k for k, _ in got], [wire.KIND_INFO, wire.KIND_ERROR])
        step, code_, msg = wire.decode_error(got[1][1])
        self.assertEqual((step, code_), (1, wire.CODE_STEP_FAILED))
        self.assertIn("over the limit of 400", msg)


class Framing(unittest.TestCase):
    def test_length_that_lies(self):
        # A header claiming 60 MiB on a stream of a few bytes: a clear error, and no
        # allocation of the claimed size (a buffered reader allocates what it is asked for).
        import tracemalloc

        data = struct.pack("<IB", 60 << 20, wire.KIND_STEP) + b"abc"
        tracemalloc.start()
        try:
            with self.assertRaisesRegex(wire.WireError, "stream ended inside a frame"):
                wire.read_frame(io.BufferedReader(io.BytesIO(data)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 8 << 20)

    def test_truncated_header(self):
        with self.assertRaisesRegex(wire.WireError, "inside a frame header"):
            wire.read_frame(io.BytesIO(b"\x05\x00"))


class Listen(unittest.TestCase):
    def test_refuses_to_replace_a_file(self):
        import os
        import tempfile

        from resin_runner.runner import serve_spec

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.safetensors")
            with open(path, "wb") as f:
                f.write(b"weights")
            self.assertEqual(serve_spec(Echo(), "unix:" + path), 2)
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b"weights")

    def test_path_appears_only_once_listening(self):
        # A supervisor waits for the socket's path, then connects: the path must not exist
        # between bind and listen, where a connect is refused.
        import os
        import socket
        import tempfile
        from unittest import mock

        from resin_runner import runner

        seen = {}

        class Sock(socket.socket):
            def listen(self, *a):
                seen["at listen"] = os.path.lexists(path)
                return super().listen(*a)

            def accept(self):
                seen["at accept"] = os.path.lexists(path)
                raise KeyboardInterrupt

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "x.sock")
            with mock.patch.object(runner.socket, "socket", Sock):
                self.assertEqual(runner.serve_spec(Echo(), "unix:" + path), 0)
            self.assertEqual(seen, {"at listen": False, "at accept": True})
            self.assertEqual(sorted(os.listdir(d)), ["x.sock"])

    def test_long_path_binds_as_given(self):
        # A path that fits sun_path (108 bytes) but whose temporary name would not binds
        # as given, rather than failing as "too long".
        import os
        import socket
        import tempfile
        from unittest import mock

        from resin_runner import runner

        class Sock(socket.socket):
            def accept(self):
                raise KeyboardInterrupt

        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            path = os.path.join(d, "s" * (104 - len(d)) + ".sock")[:107]
            self.assertLessEqual(len(path), 107)
            with mock.patch.object(runner.socket, "socket", Sock):
                self.assertEqual(runner.serve_spec(Echo(), "unix:" + path), 0)
            self.assertEqual(os.listdir(d), [os.path.basename(path)])

    def test_unlistenable_path(self):
        import contextlib
        import io as _io

        from resin_runner.runner import serve_spec

        err = _io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(serve_spec(Echo(), "unix:/nonexistent-dir/x.sock"), 2)
        self.assertIn("cannot listen there", err.getvalue())


if __name__ == "__main__":
    unittest.main()


class HostileSteps(unittest.TestCase):
    """Steps a hostile or broken engine could send: each is a WireError (a protocol Error
    on the wire), never an IndexError or OverflowError out of the decoder."""

    def step1(self) -> bytearray:
        return bytearray(payload_of(fixture("step1")[0], wire.KIND_STEP))

    def test_more_groups_than_the_request_has(self):
        # Request 9's tables were built with fewer groups than this step declares.
        tables = wire.Tables()
        tables.by_req[9] = []
        with self.assertRaisesRegex(wire.WireError, "cache groups"):
            tables.decode_step(bytes(self.step1()))

    def test_positions_that_wrap_int32(self):
        b = self.step1()
        (_, _, B, _, _, _, _, _, _, _, nops, nrel, _) = wire.STEP_HEADER.unpack_from(b)
        computed = wire.STEP_HEADER.size + 12 * nrel + 16 * nops + 8 * B  # after req_ids
        struct.pack_into("<i", b, computed, (1 << 31) - 2)  # sequence 0 schedules 3 tokens
        with self.assertRaisesRegex(wire.WireError, "wrap int32"):
            wire.Tables().decode_step(bytes(b))

    def test_serve_answers_a_decoder_bug(self):
        # Whatever escapes the decoder becomes a protocol Error and a clean return.
        class Broken(wire.Tables):
            def decode_step(self, payload):
                raise IndexError("list index out of range")

        import resin_runner.runner as runner_mod

        orig = runner_mod.Tables
        runner_mod.Tables = Broken
        try:
            out = io.BytesIO()
            code = serve(Echo(), io.BytesIO(wire.encode_hello(wire.Hello()) + fixture("step1")[0]), out)
        finally:
            runner_mod.Tables = orig
        got = frames(out.getvalue())
        self.assertEqual(code, 2)
        step, code_, msg = wire.decode_error(got[-1][1])
        self.assertEqual(code_, wire.CODE_PROTOCOL)
        self.assertIn("IndexError", msg)
