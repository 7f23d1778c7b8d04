"""benchmarks/scaling.py's grid, point sizing, resumption, FLOP model, bound naming and table (no heavy run)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scaling.py"
_SPEC = importlib.util.spec_from_file_location("scaling", _PATH)
scaling = importlib.util.module_from_spec(_SPEC)
sys.modules["scaling"] = scaling  # dataclasses look their module up while the file runs
_SPEC.loader.exec_module(scaling)
Shape = scaling.Shape


def test_grid_covers_the_brief_in_priority_order():
    keys = [(s.prompt, s.response, s.group, s.priority) for s in scaling.GRID]
    assert keys[:2] == [(256, 1024, 8, 1), (2048, 1024, 8, 1)]  # the target first
    assert {(256, 64, 8, 2), (256, 256, 8, 2), (256, 1024, 16, 3), (256, 4096, 8, 4)} <= set(keys)
    assert [k[3] for k in keys] == sorted(k[3] for k in keys)


def test_decoder_tokens_shared_prompt_vs_rows():
    s = Shape(2048, 1024, 8)
    assert s.decoder_tokens("tgc") == 2048 + 8 * 1024
    assert s.decoder_tokens("plain") == s.decoder_tokens("trl") == 8 * (2048 + 1024)
    assert Shape(256, 64, 8, prompts=2).decoder_tokens("tgc") == 2 * (256 + 8 * 64)
    assert s.response_tokens == 8192


def test_batch_shares_only_the_prompt():
    s = Shape(16, 12, 4, prompts=2)
    prompts, responses = scaling.batch_tokens(s)
    assert len(prompts) == len(responses) == 8
    assert all(len(p) == 16 for p in prompts) and all(len(r) == 12 for r in responses)
    assert prompts[0] == prompts[3] != prompts[4]  # one prompt per group
    assert len({r[0] for r in responses[:4]}) == 4  # responses diverge at their first token
    assert all(3 <= t < scaling.SHAPE["vocab_size"] for r in responses for t in r)
    assert scaling.batch_tokens(s) == (prompts, responses)  # every system gets the same batch


def test_todo_skips_stored_points_and_keeps_priority(tmp_path):
    grid = (Shape(256, 4096, 8, priority=4), Shape(256, 1024, 8, priority=1), Shape(256, 64, 8, priority=2))
    first = scaling.todo(grid, ("tgc", "trl"), tmp_path)
    assert [(s.response, x) for s, x in first] == [
        (1024, "tgc"),
        (1024, "trl"),
        (64, "tgc"),
        (64, "trl"),
        (4096, "tgc"),
        (4096, "trl"),
    ]
    (tmp_path / f"{grid[1].key('tgc')}.json").write_text("{}")
    (tmp_path / f"{grid[2].key('trl')}.json").write_text(json.dumps({"failed": "> 8 GB (killed)"}))
    left = scaling.todo(grid, ("tgc", "trl"), tmp_path)
    assert [(s.response, x) for s, x in left] == [(1024, "trl"), (64, "tgc"), (4096, "tgc"), (4096, "trl")]
    assert [s.response for s, _ in scaling.todo(grid, ("tgc",), tmp_path, only=[2, 4])] == [64, 4096]


def test_summarise_steps():
    assert scaling.summarise_steps([9.0, 2.0, 4.0, 3.0], 1) == (3.0, "median of 3 after 1 warm-up")
    assert scaling.summarise_steps([9.0], 1) == (9.0, "first step")


def test_flops_follow_the_shared_prompt():
    s = Shape(2048, 1024, 8)
    tgc, trl, plain = (scaling.flops(x, s) for x in ("tgc", "trl", "plain"))
    assert tgc["linear"] / plain["linear"] == pytest.approx(
        s.decoder_tokens("tgc") / s.decoder_tokens("plain")
    )
    assert tgc["head"] == plain["head"]  # both project response tokens only
    assert trl["head"] == plain["head"] * (2048 + 1024) / 1024  # TRL's CPU head projects every position
    assert tgc["attention"] < plain["attention"] == trl["attention"]
    # without a prompt the tree is the rows: the same pairs
    assert scaling._pairs("tgc", Shape(0, 64, 4)) == scaling._pairs("plain", Shape(0, 64, 4))


def _point(system, response, step_s, base=1000.0, peak=None, prompt=256, group=8):
    s = Shape(prompt, response, group)
    tokens = s.decoder_tokens(system)
    return {
        "system": system,
        "prompt": prompt,
        "response": response,
        "group": group,
        "prompts": 1,
        "decoder_tokens": tokens,
        "response_tokens": s.response_tokens,
        "step_s": step_s,
        "timing": "median of 2 after 1 warm-up",
        "tokens_per_s": s.response_tokens / step_s,
        "base_mb": base,
        "peak_mb": base + tokens / 100 if peak is None else peak,
    }


def _at_rate(system, response, gflops, **kw):
    s = Shape(256, response, 8)
    return _point(system, response, sum(scaling.flops(system, s).values()) / gflops / 1e9, **kw)


def test_name_bound_compute_and_linear_memory():
    pts = [_at_rate("plain", r, 100.0) for r in (64, 256, 1024, 4096)]
    text = scaling.name_bound(pts)
    assert text.startswith("time: compute (time follows model FLOPs, the rate holds at 100-100 GFLOP/s")
    assert "fixed cost" not in text and "memory: linear" in text


def test_name_bound_falling_rate_fixed_cost_and_quadratic_memory():
    pts = [_at_rate("tgc", 64, 20.0), _at_rate("tgc", 1024, 100.0), _at_rate("tgc", 4096, 40.0)]
    pts[-1]["peak_mb"] = pts[-1]["base_mb"] + 40 * (pts[1]["peak_mb"] - pts[1]["base_mb"])
    text = scaling.name_bound(pts)
    assert "time: not FLOPs (the rate falls 100 -> 40 GFLOP/s" in text
    assert "fixed cost (20 GFLOP/s at R=64)" in text
    assert "memory: superlinear" in text
    assert scaling.name_bound(pts[:1]) == "one point: no curve"


def test_table_ratios_verdict_and_missing():
    pts = [
        _point("tgc", 1024, 4.0),
        _point("trl", 1024, 10.0),
        _point("plain", 1024, 5.0),
        _point("tgc", 1024, 6.0, prompt=2048),
        _point("trl", 1024, 10.0, prompt=2048),
    ]
    out = scaling.table(pts, ["plain-p2048-r1024-g8-n1 (priority 1)"])
    rows = [ln for ln in out.splitlines() if ln.startswith("| 256 | 1024 | 8 | tgc")]
    assert rows and rows[0].endswith("| 0.40 | 0.80 |")
    trl_row = next(ln for ln in out.splitlines() if ln.startswith("| 256 | 1024 | 8 | trl"))
    assert trl_row.endswith("|  | 2.00 |")
    assert "Not measured: plain-p2048-r1024-g8-n1 (priority 1)." in out
    assert scaling.verdict(pts) == [
        "prompt 256: 0.40x TRL's step (met)",
        "prompt 2048: 0.60x TRL's step (NOT met)",
    ]
    assert scaling.verdict(pts[:1]) == ["prompt 256: not measured", "prompt 2048: not measured"]


def test_report_reads_stored_points(tmp_path):
    for p in (_point("tgc", 64, 1.0), _point("tgc", 1024, 4.0), _point("trl", 1024, 10.0)):
        (tmp_path / f"{Shape(256, p['response'], 8).key(p['system'])}.json").write_text(json.dumps(p))
    (tmp_path / "trl-p256-r4096-g8-n1.json").write_text(
        json.dumps({"key": "trl-p256-r4096-g8-n1", "failed": "> 8 GB (killed)"})
    )
    out = scaling.report(tmp_path, None)
    assert "trl-p256-r4096-g8-n1 (> 8 GB (killed))" in out
    assert "plain-p256-r1024-g8-n1 (priority 1)" in out
    assert "- tgc: time:" in out and "- trl: one point: no curve" in out
    assert "prompt 256: 0.40x TRL's step (met); prompt 2048: not measured" in out


def test_run_capped_reads_the_last_line_and_kills_above_the_cap():
    ok = [sys.executable, "-c", "print('noise'); print('{\"times\": [1.5]}')"]
    assert scaling._run_capped(ok, cap_gb=4.0) == {"times": [1.5]}
    assert scaling._run_capped([sys.executable, "-c", "raise SystemExit(3)"], 4.0) == "failed (exit 3)"
    hog = [sys.executable, "-c", "import time; b = bytearray(300 * 2**20); time.sleep(30); print('{}')"]
    assert scaling._run_capped(hog, cap_gb=0.1) == "> 0.1 GB (killed)"


@pytest.mark.parametrize("system", ["plain", "tgc"])
def test_a_tiny_real_point(system, monkeypatch):
    """The child's own path on a tiny model: every step timed, the high-water mark at or above the base."""
    tiny = {
        **scaling.SHAPE,
        "num_hidden_layers": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "vocab_size": 512,
    }
    monkeypatch.setattr(scaling, "SHAPE", tiny)
    got = scaling.run_local(system, Shape(8, 6, 2, prompts=2), threads=1, n_steps=2)
    assert len(got["times"]) == 2 and all(t > 0 for t in got["times"])
    assert got["peak_mb"] >= got["base_mb"] > 0
    assert got["detail"] == ("rows" if system == "plain" else "tree dense")  # 2 x (8 + 2 x 6) nodes: dense
