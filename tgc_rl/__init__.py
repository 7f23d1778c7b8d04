"""tgc-rl: trainer runtime (Ray actors), reward verification, control plane, SDK and CLI."""
