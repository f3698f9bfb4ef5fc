"""A driver that starts the relay and waits to be killed: ``python -m tests.support.relay_driver
ADDRESS BASE_URL``. It prints the relay's ``host:port`` once it listens. Its death (the
controller's, in a real run) must end the relay."""

from __future__ import annotations

import sys
import time


def main(address: str, base_url: str) -> None:
    import ray

    from ray_wandb_nodes._egress import RelayOnNode

    ray.init(address=address, log_to_driver=False)
    relay = RelayOnNode(base_url)
    relay.start()
    route = relay.route(60)
    assert route is not None, "the relay did not start"
    print(f"{route.host}:{route.port}", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main(*sys.argv[1:3])
