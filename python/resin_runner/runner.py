"""The Runner base class and its serve loop."""

from __future__ import annotations

import os
import socket
import stat
import sys
import traceback

from . import wire
from .wire import Plan, RunnerInfo, StepResult, Tables, WireError


class StepFailed(Exception):
    """Raised by Runner.execute for a step it cannot run; the engine fails that step's
    requests and the runner takes the next step."""


class Runner:
    """Subclass and implement info() and execute(plan). The serve loop decodes each step
    (page tables rebuilt from the deltas, releases applied), then calls release() for
    every released request, apply_cache_ops() with the step's ordered cache operations and
    execute(plan), and sends back its StepResult."""

    caps = wire.CAP_CACHE_OPS | wire.CAP_RELEASES

    def info(self) -> RunnerInfo:
        raise NotImplementedError

    def execute(self, plan: Plan) -> StepResult:
        raise NotImplementedError

    def apply_cache_ops(self, ops: list[wire.CacheOp]):
        """Runs the step's cache operations in order, before its forward. A runner that
        keeps a cache must override this (a copy-on-write of a shared page would otherwise
        be lost)."""
        if ops:
            raise StepFailed(f"{len(ops)} cache operations and this runner implements none")

    def release(self, req_id: int, reason: int):
        """Called for each request whose pages the engine freed; drop its state."""


def serve(runner: Runner, rfile, wfile, max_frame: int = wire.DEFAULT_MAX_FRAME) -> int:
    """Speaks the protocol on (rfile, wfile), binary streams, until Shutdown or the end of
    rfile. Returns a process exit status (0: a clean end)."""
    tables = Tables()
    hello = False

    def send(b: bytes):
        wfile.write(b)
        wfile.flush()

    def protocol_error(msg: str) -> int:
        print(f"resin_runner: protocol error: {msg}", file=sys.stderr)
        try:
            send(wire.encode_error(0, wire.CODE_PROTOCOL, msg))
        except OSError:
            pass
        return 2

    while True:
        try:
            fr = wire.read_frame(rfile, max_frame)
        except WireError as e:
            return protocol_error(str(e))
        if fr is None:
            return 0
        kind, payload = fr
        try:
            if kind == wire.KIND_HELLO and not hello:
                h = wire.decode_hello(payload)
                if h.max_frame:
                    max_frame = h.max_frame  # the engine's limit holds both ways
                hello = True
                send(wire.encode_info(runner.info(), runner.caps))
            elif kind == wire.KIND_STEP and hello:
                plan = tables.decode_step(payload)
                try:
                    for r in plan.released:
                        runner.release(r.req_id, r.reason)
                    runner.apply_cache_ops(plan.cache_ops)
                    res = runner.execute(plan)
                except StepFailed as e:
                    send(wire.encode_error(plan.step, wire.CODE_STEP_FAILED, str(e)))
                    continue
                except Exception as e:  # a bug in the model: fail the step, keep serving
                    traceback.print_exc(file=sys.stderr)
                    send(wire.encode_error(plan.step, wire.CODE_STEP_FAILED, f"{type(e).__name__}: {e}"))
                    continue
                out = wire.encode_result(plan.step, res)
                if len(out) - 4 > max_frame:  # the engine would refuse it and close the session
                    out = wire.encode_error(plan.step, wire.CODE_STEP_FAILED,
                                            f"the result is a frame of {len(out) - 4} bytes, over the limit of {max_frame}")
                send(out)
            elif kind == wire.KIND_SHUTDOWN:
                return 0
            else:
                return protocol_error(f"unexpected message kind {kind} (hello received: {hello})")
        except WireError as e:
            return protocol_error(str(e))
        except BrokenPipeError:
            return 0
        except Exception as e:  # a decoder bug a hostile frame found: answer it, do not die
            traceback.print_exc(file=sys.stderr)
            return protocol_error(f"could not decode the {kind} message: {type(e).__name__}: {e}")


def serve_spec(runner: Runner, listen: str | None) -> int:
    """Serves on stdin/stdout (listen None) or on a Unix socket (listen "unix:PATH"), one
    engine connection after another."""
    if not listen:
        # The protocol owns stdout: anything printed by the model goes to stderr.
        out = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)
        return serve(runner, sys.stdin.buffer, out)
    scheme, _, path = listen.partition(":")
    if scheme != "unix" or not path:
        print(f"--listen {listen!r}: want unix:PATH", file=sys.stderr)
        return 2
    if os.path.lexists(path):
        # Only a stale socket (a runner that listened here before) is replaced: a typo must
        # not delete a file.
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            print(f"--listen unix:{path}: the path exists and is not a socket; refusing to replace it", file=sys.stderr)
            return 2
        os.unlink(path)
    # Bound under a temporary name and renamed once it listens, the socket appears at path
    # only when a connect succeeds: a supervisor that waits for the path to exist never
    # sees ECONNREFUSED from the moment between bind and listen.
    tmp = os.path.join(os.path.dirname(path), f".{os.getpid()}.{os.path.basename(path)}")
    if len(os.fsencode(tmp)) > 107:  # sun_path's limit: a path that fits binds as given
        tmp = path
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(tmp)
        srv.listen(1)
        if tmp != path:
            os.rename(tmp, path)
    except OSError as e:
        srv.close()
        if tmp != path and os.path.lexists(tmp):
            os.unlink(tmp)
        print(f"--listen unix:{path}: cannot listen there: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"resin_runner: listening on unix:{path}", file=sys.stderr, flush=True)
    try:
        while True:
            conn, _ = srv.accept()
            with conn:
                rf, wf = conn.makefile("rb"), conn.makefile("wb")
                try:
                    serve(runner, rf, wf)
                except Exception:  # one engine connection's failure never takes the listener down
                    traceback.print_exc(file=sys.stderr)
    except KeyboardInterrupt:
        return 0
    finally:
        srv.close()
