"""Custom rewards for trainer tests (run in the reward pool's worker processes, named in task.reward)."""


def text_parity(item, response: str) -> float:
    """1 for an even number of characters: mixed rewards inside groups even for a random-init model."""
    return float(len(response) % 2 == 0)


def parity_on_odd_items(item, response: str) -> float:
    """Items with an even index score 1 whatever the response (all-equal groups, no learning signal); the
    others score by text parity (mixed groups)."""
    if int(item.id.rsplit("-", 1)[1]) % 2 == 0:
        return 1.0
    return text_parity(item, response)
