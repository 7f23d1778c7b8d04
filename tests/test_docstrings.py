"""Docstrings and comments name files that exist: a module that moves or goes takes its mentions with it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `name.py` in backticks, or a repository path such as tgc_rl/weight_sync/flat.py
_MENTION = re.compile(
    r"`([\w/]+\.py)`|\b((?:tgc_rl|rlcore|tests|benchmarks|scripts|experiments)/[\w/.-]+\.py)\b"
)


def _exists(mention: str, near: Path) -> bool:
    if "/" in mention:
        return (ROOT / mention).exists()
    return (
        (near.parent / mention).exists()
        or any(ROOT.glob(f"tgc_rl/**/{mention}"))
        or any(ROOT.glob(f"rlcore/**/{mention}"))
    )


def test_every_file_a_source_file_mentions_exists():
    missing = [
        f"{path.relative_to(ROOT)}: {mention}"
        for path in [*ROOT.glob("tgc_rl/**/*.py"), *ROOT.glob("rlcore/**/*.py")]
        for m in _MENTION.finditer(path.read_text())
        if not _exists(mention := m.group(1) or m.group(2), path)
    ]
    assert not missing, "stale file names:\n" + "\n".join(missing)
