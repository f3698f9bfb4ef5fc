"""What the relay costs the controller's node at 8, 64 and 1,000 node writers, and how late a
node's samples reach the run through it against direct.

    python -m bench.relay_cost [--real-s 240] [--sim-s 90] [--writers 8 64 1000] [--gpus 8] [--json FILE]

1. **One real writer's traffic.** Two node writers (wandb-core, made as the plugin makes them:
   ``tests/support/egress_writer.py``) at the plugin's defaults (a sample every 15 s, wandb's own
   file_stream interval), each on a node of ``--gpus`` scripted GPUs (``tests/support/nvml.py``:
   wandb's monitor reports them as it reports real ones, so a sample has an 8-GPU node's keys),
   each into a W&B test backend of its own serving HTTPS with a certificate the bench makes: one
   writes straight from the machine, the other from a node namespace with no route to W&B,
   through the relay (CONNECT), the relay in a process of its own as in its actor. Measured over
   ``--real-s`` after a warm-up of 30 s: the relayed writer's bytes a second up and down, its
   requests (as its backend counts them) and the connections it keeps and opens, then what its
   finish sends; and, for both writers, each sample's lateness: from its ``_timestamp`` to its
   arrival at the backend.
2. **Simulated writers** (``bench/_relay_load.py``), 8, 64 and 1,000 of them, each with the real
   writer's connections, request sizes and rate (TLS records included: the relay sees bytes
   only), through the relay to a sink, for ``--sim-s`` after one request period of warm-up;
   beside them 8 more that go straight to the sink, at the same time, for the baseline. Measured:
   the relay process's CPU (% of one core) and resident memory, bytes a second through it,
   connections, and the round trip of a request through it against straight.

Needs root (a network namespace, ``tests/support/netns.py``) and the ``openssl`` command; starts
no Ray. Writes ``bench/results/relay_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import write_result
from bench._procs import cpu_seconds, rss_mib
from bench._relay_load import Profile, RelayProcess, RoundTrips, quantile, sink, writer_connection
from ray_wandb_nodes._egress import endpoint_of, new_token
from ray_wandb_nodes._egress.actor import raise_descriptor_limit
from tests.support.env import DUMMY_KEY
from tests.support.netns import Netns, node_namespace
from tests.support.nvml import Gpu, ScriptedGpus
from tests.support.tls import make_certificate
from tests.support.wandb_backend import WandbTestBackend

WARMUP_S = 30.0
PROBES = 8


class ArrivalBackend(WandbTestBackend):
    """The test backend, noting when each system-metric sample arrives: (its time, arrival)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrivals: list[tuple[float, float]] = []

    def file_stream(self, entity: str, project: str, run_id: str, body: dict[str, Any], client_id: str) -> None:
        arrived = time.time()
        events = (body.get("files") or {}).get("wandb-events.jsonl") or {}
        for line in events.get("content") or []:
            self.arrivals.append((float(json.loads(line)["_timestamp"]), arrived))
        super().file_stream(entity, project, run_id, body, client_id)


def lateness(backend: ArrivalBackend, start: float, end: float) -> dict[str, float]:
    """How late the samples taken between ``start`` and ``end`` (``time.time()``) arrived."""
    late = [arrived - sampled for sampled, arrived in backend.arrivals if start <= sampled <= end]
    return {
        "samples": len(late),
        "mean_s": sum(late) / len(late) if late else float("nan"),
        "p50_s": quantile(late, 0.5),
        "max_s": max(late) if late else float("nan"),
    }


def now() -> float:
    return time.time()  # the clock of the samples' _timestamp


def real_writers(ns: Netns, folder: Path, real_s: float, gpus: int) -> dict[str, Any]:
    cert = make_certificate(folder / "tls", ns.wandb)
    scripted = ScriptedGpus(folder / "gpus.txt", [Gpu() for _ in range(gpus)]) if gpus else None
    direct = ArrivalBackend(host=ns.wandb, tls=cert.server_context()).start()
    relayed = ArrivalBackend(host=ns.wandb, tls=cert.server_context()).start()
    token = new_token()
    relay = RelayProcess(ns.head, token, [str(endpoint_of(relayed.base_url))])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")},
        "WANDB_API_KEY": DUMMY_KEY, "WANDB_PROJECT": "relay-cost", "WANDB_DIR": str(folder),
        "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false", "SSL_CERT_FILE": str(cert.ca),
        "RWN_SAMPLING_S": "15", "RWN_STREAM_S": "default", **(scripted.env() if scripted else {}),
    }  # fmt: skip
    stop = folder / "stop"
    argv = [sys.executable, "-m", "tests.support.egress_writer", "node"]
    writers = [
        subprocess.Popen(
            [*argv, "direct", "node-direct", str(stop)],
            env={**env, "WANDB_BASE_URL": direct.base_url}, stdout=subprocess.PIPE, text=True,
        ),
        subprocess.Popen(
            ns.command([*argv, "relayed", "node-relayed", str(stop)]),
            env={**env, "WANDB_BASE_URL": relayed.base_url, "RWN_RELAY": f"{ns.head}:{relay.port}",
                 "RWN_RELAY_TOKEN": token.reveal()},
            stdout=subprocess.PIPE, text=True,
        ),
    ]  # fmt: skip
    try:
        for w in writers:
            assert w.stdout is not None
            json.loads(w.stdout.readline())  # joined
        time.sleep(WARMUP_S)
        before, requests0, cpu0, t0 = relay.ask("stats"), len(relayed.requests), cpu_seconds(relay.pid), now()
        time.sleep(real_s)
        after, requests1, cpu1, t1 = relay.ask("stats"), len(relayed.requests), cpu_seconds(relay.pid), now()
        stop.touch()
        for w in writers:
            w.wait(120)
        finished = relay.ask("stats")
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
        relay.stop()
        direct.stop()
        relayed.stop()
    dt = t1 - t0
    per_min = (requests1 - requests0) / dt * 60
    metrics = {k for row in relayed.run("relayed").events for k in row if k.startswith("system.")}
    return {
        "gpus": gpus,
        "system_metric_keys": len(metrics),
        "seconds": dt,
        "bytes_up_per_s": (after["bytes_up"] - before["bytes_up"]) / dt,
        "bytes_down_per_s": (after["bytes_down"] - before["bytes_down"]) / dt,
        "requests_per_min": per_min,
        "connections_open": after["open"],
        "connections_opened_per_min": (after["tunnels"] - before["tunnels"]) / dt * 60,
        "relay_cpu_percent": 100 * (cpu1 - cpu0) / dt,
        "finish_bytes": finished["bytes_up"] + finished["bytes_down"] - after["bytes_up"] - after["bytes_down"],
        "finish_connections": finished["tunnels"] - after["tunnels"],
        "lateness_direct": lateness(direct, t0, t1),
        "lateness_relayed": lateness(relayed, t0, t1),
    }


def profile_of(real: dict[str, Any]) -> Profile:
    """The simulated writer: the real one's connections, and its requests spread over them."""
    connections = max(1, int(real["connections_open"]))
    per_min = max(real["requests_per_min"], 1.0)
    period = 60.0 * connections / per_min
    up = max(64, round(real["bytes_up_per_s"] * 60 / per_min))
    down = max(64, round(real["bytes_down_per_s"] * 60 / per_min))
    return Profile(connections, period, up, down)


async def simulate(ns: Netns, writers: int, profile: Profile, sim_s: float) -> dict[str, Any]:
    server, port = await sink(ns.wandb)
    token = new_token()
    relay = RelayProcess(ns.head, token, [f"{ns.wandb}:{port}"])
    loop = asyncio.get_running_loop()
    measure_from = loop.time() + profile.period_s
    until = measure_from + sim_s
    through, straight = RoundTrips(), RoundTrips()
    target = (ns.wandb, port)
    tasks = [
        writer_connection((ns.head, relay.port), target, token, profile, until, measure_from, through)
        for _ in range(writers * profile.connections)
    ] + [writer_connection(None, target, token, profile, until, measure_from, straight) for _ in range(PROBES)]
    running = asyncio.gather(*tasks)
    try:
        await asyncio.sleep(max(0.0, measure_from - loop.time()))
        before, cpu0, t0 = relay.ask("stats"), cpu_seconds(relay.pid), loop.time()
        await asyncio.sleep(max(0.0, until - loop.time()))
        after, cpu1, t1, rss = relay.ask("stats"), cpu_seconds(relay.pid), loop.time(), rss_mib(relay.pid)
        await running
    finally:
        relay.stop()
        server.close()
    dt = t1 - t0
    return {
        "writers": writers,
        "connections_open": after["open"],
        "connections_peak": after["peak"],
        "relay_cpu_percent": 100 * (cpu1 - cpu0) / dt,
        "relay_rss_mib": rss,
        "bytes_per_s": (after["bytes_up"] + after["bytes_down"] - before["bytes_up"] - before["bytes_down"]) / dt,
        "round_trip_p50_ms": {"relay": ms(through, 0.5), "direct": ms(straight, 0.5)},
        "round_trip_p99_ms": {"relay": ms(through, 0.99), "direct": ms(straight, 0.99)},
        "requests": len(through.seconds),
        "failed": through.failed + straight.failed,
    }  # fmt: skip


def ms(trips: RoundTrips, q: float) -> float:
    return 1e3 * quantile(trips.seconds, q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-s", type=float, default=240.0)
    parser.add_argument("--sim-s", type=float, default=90.0)
    parser.add_argument("--writers", type=int, nargs="+", default=[8, 64, 1000])
    parser.add_argument("--gpus", type=int, default=8, help="scripted GPUs on each real writer's node (0: none)")
    parser.add_argument("--json", default="bench/results/relay_cost.json")
    args = parser.parse_args()
    raise_descriptor_limit(20000)
    with node_namespace() as ns, tempfile.TemporaryDirectory() as tmp:
        ns.block(ns.wandb, "prohibit")
        real = real_writers(ns, Path(tmp), args.real_s, args.gpus)
        profile = profile_of(real)
        print(f"one real writer through the relay over {real['seconds']:.0f} s: {real['bytes_up_per_s']:.0f} B/s up, "
              f"{real['bytes_down_per_s']:.0f} B/s down, {real['requests_per_min']:.1f} requests and "
              f"{real['connections_opened_per_min']:.2f} new connections a minute, {real['connections_open']} open; "
              f"relay {real['relay_cpu_percent']:.3f} % of a core; {real['system_metric_keys']} system keys "
              f"({real['gpus']} GPUs); its finish: {real['finish_bytes']} bytes, "
              f"{real['finish_connections']} new connections")  # fmt: skip
        for way in ("direct", "relayed"):
            late = real[f"lateness_{way}"]
            print(f"  samples {way:8}: {late['samples']:3d}, late mean {late['mean_s']:.2f} s, "
                  f"p50 {late['p50_s']:.2f} s, max {late['max_s']:.2f} s")  # fmt: skip
        print(f"simulated writer: {profile}")
        rows = [asyncio.run(simulate(ns, n, profile, args.sim_s)) for n in args.writers]
    print(f"{'writers':>8} {'conns':>6} {'relay CPU':>10} {'RSS MiB':>8} {'KB/s':>8} "
          f"{'RTT p50 relay/direct ms':>24} {'p99 relay/direct ms':>20} {'failed':>6}")  # fmt: skip
    for r in rows:
        p50, p99 = r["round_trip_p50_ms"], r["round_trip_p99_ms"]
        cpu, rss = r["relay_cpu_percent"], r["relay_rss_mib"]
        print(f"{r['writers']:>8} {r['connections_open']:>6} {cpu:>9.2f}% {rss:>8.1f} "
              f"{r['bytes_per_s'] / 1e3:>8.1f} {p50['relay']:>11.2f} / {p50['direct']:<10.2f} "
              f"{p99['relay']:>8.2f} / {p99['direct']:<9.2f} {r['failed']:>6}")  # fmt: skip
    write_result(args.json, {"real_writer": real, "profile": profile.__dict__, "simulated": rows})


if __name__ == "__main__":
    main()
