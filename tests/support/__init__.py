"""What the tests stand on: the W&B-compatible backend, local Ray clusters, the W&B environment,
the standard Train run and helpers that read runs as the backend recorded them."""
