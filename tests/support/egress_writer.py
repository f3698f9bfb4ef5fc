"""One W&B writer in a process of its own, made as the plugin makes it (``_writers``, and
``_wandb_io.init_writer``): the primary of a shared run, or a node writer that joins it, through
the relay when ``RWN_RELAY`` (``host:port``) and ``RWN_RELAY_TOKEN`` are set.

    python -m tests.support.egress_writer primary|node RUN_ID LABEL STOP_FILE

The W&B host, key, project and folder come from the environment (``WANDB_*``), as on a node;
``RWN_SAMPLING_S`` (1) and ``RWN_STREAM_S`` (1, or ``default``) set how often it samples and
sends. It prints one JSON line once it has joined (what its process and its wandb-core hold:
proxy variables, whether the process's wandb settings name the relay), writes until ``STOP_FILE``
exists (the primary a row every 0.2 s, a node writer system metrics only), finishes, and prints
``finished``. Run by ``tests/unit/egress/test_relay_with_wandb.py`` (a node writer inside a node's network
namespace) and ``bench/relay_cost.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from ray_wandb_nodes._config.options import build_options
from ray_wandb_nodes._config.secrets import Secret, capture_env
from ray_wandb_nodes._config.values import Mode
from ray_wandb_nodes._egress import RelayRoute, ray_proxy_variables, writer_settings
from ray_wandb_nodes._wandb.runs import init_writer
from ray_wandb_nodes._wandb.writers import node_spec, primary_spec


def core_environ() -> dict[str, str]:
    """The environment of this process's wandb-core (a child of it)."""
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if stat.rsplit(")", 1)[1].split()[1] == me and b"wandb-core" in cmdline:
                raw = Path(f"/proc/{pid}/environ").read_bytes()
                return dict(kv.split("=", 1) for kv in raw.decode().split("\0") if "=" in kv)
        except (OSError, IndexError):
            continue
    return {}


def main() -> None:
    role, run_id, label, stop_file = sys.argv[1:5]
    interval = float(os.environ.get("RWN_SAMPLING_S", "1"))
    stream = os.environ.get("RWN_STREAM_S", "1")  # "default": wandb's own file_stream interval
    settings = {} if stream == "default" else {"x_file_stream_transmit_interval": float(stream)}
    options = build_options(sampling_interval_s=interval, wandb_init_kwargs={"settings": settings})
    env = capture_env(os.environ)
    spec = primary_spec(
        options, env, mode=Mode.ONLINE, run_id=run_id, label=label, display_name=None, group=None, config={},
        default_dir=os.environ.get("WANDB_DIR"),
    )  # fmt: skip
    route = None
    if role == "node":
        spec = node_spec(spec, label=label, entity=None, project=None)
        if os.environ.get("RWN_RELAY"):
            host, port = os.environ["RWN_RELAY"].rsplit(":", 1)
            route = RelayRoute(host, int(port), Secret(os.environ.pop("RWN_RELAY_TOKEN")))
            spec = replace(spec, settings={**spec.settings, **writer_settings(route)})
    started = time.time()
    run = init_writer(spec)
    import wandb

    process = wandb.setup().settings
    print(
        json.dumps(
            {
                "joined_s": time.time() - started,
                "process_proxy_variables": sorted(ray_proxy_variables(os.environ)),
                "core_proxy_variables": sorted(ray_proxy_variables(core_environ())),
                "core_found": bool(core_environ()),
                "process_settings_name_the_relay": route is not None
                and process.https_proxy == route.proxy_url()
                and process.http_proxy == route.proxy_url(),
            }
        ),
        flush=True,
    )
    step = 0
    while not os.path.exists(stop_file):
        if role == "primary":
            run.log({"training_iteration": step, "loss": 1.0 / (step + 1)})
            step += 1
        time.sleep(0.2)
    run.finish()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
