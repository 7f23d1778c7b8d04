"""Checkpoint directories: written under a temporary name and renamed when complete, keep-last-N."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tgc_rl.run_layout import TRAINER_STATE_FILE as TRAINER_STATE
from tgc_rl.run_layout import checkpoint_name, checkpoint_step


class Checkpoints:
    def __init__(self, root: Path, keep_last: int):
        self.root, self.keep_last = root, keep_last
        self.root.mkdir(parents=True, exist_ok=True)

    def staging(self, step: int) -> Path:
        tmp = self.root / f".tmp-{checkpoint_name(step)}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, state: dict[str, Any]) -> Path:
        """Write the trainer state last, then rename: a checkpoint without it never becomes visible."""
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=1))
        final = self.root / checkpoint_name(step)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.complete()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def complete(self) -> list[Path]:
        found = [
            (step, p)
            for p in self.root.iterdir()
            if (step := checkpoint_step(p.name)) is not None and (p / TRAINER_STATE).exists()
        ]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None


def read_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / TRAINER_STATE
    if not path.exists():
        raise ValueError(f"{checkpoint} is not a complete checkpoint (no {TRAINER_STATE}); pick another one")
    return json.loads(path.read_text())
