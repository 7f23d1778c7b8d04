"""Experiments that test the token-gradient-cancellation claims at small scale (issue 6).

Three testbeds, cheapest first, all on rlcore's objectives and diagnostics:

1. `experiments.tabular` — the tabular toy (docs/objectives.md#the-tabular-toy), plus mini-batching;
2. `experiments.tinylm` — a tiny transformer trained from scratch on a synthetic task whose length and
   style are policy-controlled and carry no reward, and whose parameters are shared between contexts;
3. `experiments.trainer_study` / `experiments.sweep` — SmolLM2-135M through the project's trainer,
   run here or submitted to the control plane as a sweep.

`python -m experiments --help` lists the commands; `experiments/REPORT.md` is the rendered report.
"""
