"""Experiment: the interpreter time one request costs on a batched server's request path.

A zoo model is served with ``max_batch=64`` behind a no-op executor (a batch costs
nothing: what is left is the request path itself — checks, queue, gathering, splitting,
delivery), and 64 closed-loop callback clients send a fixed number of requests, either
from an event loop thread (``loop``: ``request_with_callback(loop, ...)``) or from the
server's worker thread (``workers``: ``request_with_callback(None, ...)``). The process
is pinned to one core, so its CPU time over the requests answered is the work per
request, whatever else the machine runs (which still slows a core: take the minimum of
several rounds). With ``--baseline PATH`` (another checkout of this repository) each
setting is measured from both checkouts in alternating fresh processes, so that the two
are compared under the same conditions. Writes ``request-path.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import noop_executor, write_result


def child(model_name: str, clients: str, requests: int, rounds: int) -> dict[str, Any]:
    """CPU microseconds per request in each of ``rounds`` rounds (this process)."""
    import asyncio
    import threading

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    import pyc_lab as pl
    from pyc_lab.inference import gpu, zoo

    model = pl.inference.load(zoo.build(model_name))
    noop = noop_executor(model)
    gpu.bucket_executor = lambda *a, **k: noop
    server = pl.serve(model, max_batch=64, max_delay_ms=2.0)
    server.warm_up()
    arrays = model.example(1, seed=7)
    request = server.request_with_callback

    def level(loop: Any, finished: Any) -> float:
        count = [0]
        running = [64]

        class Client:
            __slots__ = ("answered",)

            def __init__(self) -> None:
                self.answered = self._answered

            def send(self) -> None:
                if count[0] >= requests:
                    running[0] -= 1
                    if not running[0]:
                        finished()
                    return
                request(loop, self.answered, arrays, None, None)

            def _answered(self, outputs: Any, exc: BaseException | None) -> None:
                count[0] += 1
                self.send()

        c0 = time.process_time()
        for _ in range(64):
            Client().send()
        return c0

    cpu_us = []
    for _ in range(rounds):
        if clients == "workers":
            done = threading.Event()
            c0 = level(None, done.set)
            done.wait()
        else:
            async def on_loop() -> float:
                loop = asyncio.get_running_loop()
                fut = loop.create_future()
                c0 = level(loop, lambda: fut.set_result(None))
                await fut
                return c0

            c0 = asyncio.run(on_loop())
        cpu_us.append((time.process_time() - c0) / requests * 1e6)
    server.close()
    return {"model": model_name, "clients": clients, "cpu_us_per_request": cpu_us,
            "min_cpu_us": min(cpu_us), "pyc_lab": str(Path(pl.__file__).parent)}


def _one(root: str, name: str, clients: str, requests: int, rounds: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, clients, str(requests), str(rounds)]
    env = {**os.environ, "PYTHONPATH": root}
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=root, env=env)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"model": name, "clients": clients, "error": res.stderr[-2000:]}


def _sha(root: str) -> str:
    res = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    return res.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write request-path.json into this folder")
    parser.add_argument("--models", nargs="*", default=["astro_mlp", "biology_vae"])
    parser.add_argument("--clients", nargs="*", default=["workers", "loop"])
    parser.add_argument("--requests", type=int, default=60000)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per process")
    parser.add_argument("--pairs", type=int, default=3,
                        help="processes per checkout and setting, alternating")
    parser.add_argument("--baseline", help="another checkout to compare with")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, clients, requests, rounds = args.child
        print(json.dumps(child(name, clients, int(requests), int(rounds))))
        return
    here = str(Path(__file__).resolve().parent.parent)
    roots = {"candidate": here} | ({"baseline": args.baseline} if args.baseline else {})
    rows = []
    for name in args.models:
        for clients in args.clients:
            for _ in range(args.pairs):
                for label, root in roots.items():
                    row = _one(root, name, clients, args.requests, args.rounds)
                    row.update(checkout=label, git_sha=_sha(root))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary = {}
    for name in args.models:
        for clients in args.clients:
            for label in roots:
                mins = [r["min_cpu_us"] for r in rows if r["model"] == name
                        and r["clients"] == clients and r["checkout"] == label
                        and "min_cpu_us" in r]
                if mins:
                    summary[f"{name}/{clients}/{label}"] = min(mins)
    print(json.dumps(summary, indent=1))
    if args.out:
        path = write_result(args.out, "request-path", {
            "method": "no-op executor, max_batch=64, 64 closed-loop callback clients, the "
                      "process pinned to one core; CPU microseconds per request (process "
                      "time over requests answered), per round; checkouts alternate in "
                      "fresh processes; summary: the minimum over rounds and processes",
            "baseline_sha": _sha(args.baseline) if args.baseline else None,
            "rows": rows, "min_cpu_us": summary})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
