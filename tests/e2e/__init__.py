"""End-to-end tests: real Ray clusters (``ray.cluster_utils.Cluster``) and the real wandb client."""
