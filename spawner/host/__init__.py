"""The host's CPUs and memory as a resource (docs/deployment.md#host-capacity)."""
