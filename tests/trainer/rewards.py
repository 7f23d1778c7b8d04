"""Custom rewards for trainer tests (run in the reward pool's worker processes, named in task.reward)."""


def text_parity(item, response: str) -> float:
    """1 for an even number of characters: mixed rewards inside groups even for a random-init model."""
    return float(len(response) % 2 == 0)
