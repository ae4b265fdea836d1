"""Experiment: what bounds a batched server's requests per second — the interpreter's
work per request, and where its two threads run.

Under closed-loop load (``pl.inference.load_test``: 64 clients as callbacks on one event
loop thread) a batched server does its per-request Python on two threads — the clients'
loop and the batcher's worker — that take turns holding the interpreter. This measures,
per zoo model and ``max_batch`` (1 = unbatched), requests per second and each thread's
CPU seconds (from ``/proc/self/task``), in these settings, each in a fresh process:

- ``executor``: ``model`` (the served model: on a GPU the bucket executor's CUDA graphs,
  else the NumPy backend) or ``noop`` (a batch costs nothing: the request path alone);
- ``cores``: ``all`` (as a user runs it) or ``one`` (the process pinned to one core with
  ``os.sched_setaffinity``, so the two threads never hand the interpreter, and the
  objects they share, across cores);
- ``clients``: ``loop`` (callbacks on an event loop thread of the load generator's) or
  ``workers`` (callbacks on the server's worker thread: one thread in all).

Writes ``batching-threads.json`` to ``--out``.
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


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread name."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        name = names.get(int(tid), "other")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def child(model_name: str, max_batch: int, executor: str, cores: str, clients: str,
          duration_s: float) -> dict[str, Any]:
    """One setting, measured in this process (run by :func:`main` in a subprocess)."""
    import threading

    if cores == "one":
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import pyc_lab as pl
    from pyc_lab.inference import gpu, zoo

    model = pl.inference.load(zoo.build(model_name))
    if executor == "noop":
        noop = noop_executor(model)
        gpu.bucket_executor = lambda *a, **k: noop
    server = pl.serve(model, max_batch=max_batch, max_delay_ms=2.0)
    cpu: dict[str, float] = {}
    stop = threading.Event()

    def poll() -> None:  # the load thread ends with its level: read it while it lives
        while not stop.is_set():
            for k, v in _thread_cpu().items():
                cpu[k] = max(cpu.get(k, 0.0), v)
            time.sleep(0.02)

    server.warm_up()
    before = _thread_cpu()
    poller = threading.Thread(target=poll, name="poll", daemon=True)
    poller.start()
    frame = pl.inference.load_test(server, concurrency=[64], duration_s=duration_s,
                                   warmup_s=0.5, clients=clients)
    stop.set()
    poller.join()
    server.close()
    row = frame.iloc[0]
    threads = {k: round(v - before.get(k, 0.0), 3) for k, v in cpu.items()
               if k.startswith("pyc-lab")}
    return {"model": model_name, "max_batch": max_batch, "executor": executor,
            "cores": cores, "clients": clients, "throughput_rps": float(row.throughput_rps),
            "p99_ms": float(row.p99_ms), "compute_mean_ms": float(row.compute_mean_ms),
            "mean_batch": float(row.mean_batch), "thread_cpu_s": threads,
            "elapsed_s": duration_s + 0.5}


def _one(name: str, mb: int, ex: str, cores: str, clients: str,
         duration_s: float) -> dict[str, Any]:
    """One setting in a fresh process (its row, or the error it ended with)."""
    cmd = [sys.executable, __file__, "--duration-s", str(duration_s),
           "--child", name, str(mb), ex, cores, clients]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    last = res.stdout.strip().splitlines()[-1:] if res.stdout else []
    try:
        return json.loads(last[0])
    except (IndexError, json.JSONDecodeError):
        return {"model": name, "max_batch": mb, "executor": ex, "cores": cores,
                "clients": clients, "error": res.stderr[-2000:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write batching-threads.json into this folder")
    parser.add_argument("--models", nargs="*", default=["astro_mlp", "biology_vae"])
    parser.add_argument("--max-batch", nargs="*", type=int, default=[1, 32, 64])
    parser.add_argument("--executors", nargs="*", default=["model", "noop"])
    parser.add_argument("--cores", nargs="*", default=["all", "one"])
    parser.add_argument("--clients", nargs="*", default=["loop", "workers"])
    parser.add_argument("--duration-s", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds; the settings interleaved within each")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, mb, ex, cores, clients = args.child
        print(json.dumps(child(name, int(mb), ex, cores, clients, args.duration_s)))
        return
    rows = []
    for rnd in range(args.repeats):
        for name in args.models:
            for ex in args.executors:
                for cores in args.cores:
                    for clients in args.clients:
                        for mb in args.max_batch:
                            rows.append(_one(name, mb, ex, cores, clients, args.duration_s))
                            rows[-1]["round"] = rnd
                            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        path = write_result(args.out, "batching-threads", {
            "method": "pl.inference.load_test, 64 callback clients, max_delay_ms=2, each "
                      "setting in a fresh process, settings interleaved per round",
            "rows": rows})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
