"""The trainer driver: a Ray job entrypoint that runs rollout -> reward -> advantages -> update -> sync."""
