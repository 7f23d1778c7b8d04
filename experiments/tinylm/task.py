"""The synthetic task of testbed 2 (objectives.md sec. 9.4, "Tiny-LM extension").

A response is a short token sequence whose grammar is fixed and whose content the policy chooses:

    [BOS, P_k | T, O, A, S, F ... F, EOS]
     prompt     template, opener, answer, style, fillers, end

- `T` template (4 choices, base p(T1) = .9): reward-irrelevant and usually group-common.
- `O` opener (2 choices, .5/.5): reward-irrelevant.
- `A` answer (8 choices): reward 1 iff it is one of the prompt's two correct answers (two *equivalent*
  solutions, so the log-odds between them measures equivalent-solution drift, D8). Prompt k's base
  P(correct) ranges from .05 (hard) to .6 (easy), as in the tabular toy.
- `S` style (concise / verbose, .5/.5): reward-irrelevant, but verbose responses are longer.
- fillers `F1..F3` then `EOS`: the policy decides when to stop, so length is policy-controlled. In the
  base distribution wrong answers ramble (5-9 fillers vs 1-3) and verbose adds 4, so lengths are coupled
  to the reward exactly as in real reasoning RL (objectives.md sec. 9.1), without ever entering it.

Probe sequences `[BOS, Q_j, T, O, F x PROBE_FILL, EOS]` reuse the same tokens in contexts that RL never
samples; how far their next-token distributions move is the spill-over / learning-tax probe (D5).
The "pretraining" (SFT) distribution of both is known exactly, so the base model is trained on exact
next-token targets instead of sampled ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

PAD, BOS, EOS = 0, 1, 2
TEMPLATE = (3, 4, 5, 6)
OPENER = (7, 8)
N_ANSWERS = 8
ANSWER = tuple(range(9, 9 + N_ANSWERS))
CONCISE, VERBOSE = 17, 18
FILLER = (19, 20, 21)
FIRST_PROMPT = 22

# Response grammar: slot of response position j (0 template, 1 opener, 2 answer, 3 style, >= 4 filler/EOS).
HEAD = 4
MAX_FILL = 14
MAX_RESPONSE = HEAD + MAX_FILL + 1
PROMPT_LEN = 2
PROBE_FILL = 6

FILL_CORRECT = (1, 2, 3)      # base filler counts (uniform) after a correct answer ...
FILL_WRONG = (5, 6, 7, 8, 9)  # ... after a wrong one: wrong answers ramble
VERBOSE_EXTRA = 4


@dataclass(frozen=True)
class TaskConfig:
    n_prompts: int = 64
    n_probe_prompts: int = 16
    p_template: float = 0.9
    p_correct_min: float = 0.05
    p_correct_max: float = 0.6
    seed: int = 0  # which answers are correct for which prompt, and the probe distributions

    def __post_init__(self) -> None:
        if self.n_prompts < 2:
            raise ValueError(f"TaskConfig.n_prompts must be >= 2, got {self.n_prompts}")
        if self.n_probe_prompts < 1:
            raise ValueError(f"TaskConfig.n_probe_prompts must be >= 1, got {self.n_probe_prompts}")
        if not 0 < self.p_template < 1:
            raise ValueError(f"TaskConfig.p_template must be in (0, 1), got {self.p_template}")
        if not 0 < self.p_correct_min <= self.p_correct_max < 1:
            raise ValueError("TaskConfig: need 0 < p_correct_min <= p_correct_max < 1, got "
                             f"{self.p_correct_min}, {self.p_correct_max}")


def _hazards(counts: tuple[int, ...]) -> np.ndarray:
    """P(EOS after n fillers | n fillers so far) for n = 0..MAX_FILL, for a uniform filler count."""
    p = np.zeros(MAX_FILL + 1)
    p[list(counts)] = 1.0 / len(counts)
    survive = p[::-1].cumsum()[::-1]  # P(N >= n)
    return np.divide(p, survive, out=np.ones_like(p), where=survive > 0)


class SyntheticTask:
    """Vocabulary, grammar, rewards and the exact base distribution of the testbed-2 task."""

    def __init__(self, cfg: TaskConfig | None = None):
        self.cfg = cfg = cfg or TaskConfig()
        rng = np.random.default_rng(cfg.seed)
        self.first_probe = FIRST_PROMPT + cfg.n_prompts
        self.vocab_size = self.first_probe + cfg.n_probe_prompts
        self.seq_len = PROMPT_LEN + MAX_RESPONSE
        k = cfg.n_prompts
        self.p_correct = np.exp(np.linspace(np.log(cfg.p_correct_min), np.log(cfg.p_correct_max), k))
        # Two distinct correct answers per prompt (index into ANSWER).
        self.correct = np.stack([rng.choice(N_ANSWERS, size=2, replace=False) for _ in range(k)])
        ans = np.repeat(((1 - self.p_correct) / (N_ANSWERS - 2))[:, None], N_ANSWERS, 1)
        ans[np.arange(k), self.correct[:, 0]] = self.p_correct / 2
        ans[np.arange(k), self.correct[:, 1]] = self.p_correct / 2
        self.answer_probs = ans                                            # (K, 8)
        self.hazard = {(c, v): _hazards(tuple(n + (VERBOSE_EXTRA if v else 0) for n in
                                              (FILL_CORRECT if c else FILL_WRONG)))
                       for c in (False, True) for v in (False, True)}
        # Probe contexts: their own template/opener/filler distributions, fixed per probe prompt.
        j = cfg.n_probe_prompts
        self.probe_template = rng.dirichlet(np.ones(4), size=j)
        self.probe_opener = rng.dirichlet(np.ones(2), size=j)
        self.probe_filler = rng.dirichlet(np.ones(3), size=j)
        self.allowed = self._grammar()

    # -- grammar ------------------------------------------------------------------------------------
    def _grammar(self) -> torch.Tensor:
        """(MAX_RESPONSE, V) bool: which tokens may appear at each response position."""
        allowed = torch.zeros(MAX_RESPONSE, self.vocab_size, dtype=torch.bool)
        allowed[0, list(TEMPLATE)] = True
        allowed[1, list(OPENER)] = True
        allowed[2, list(ANSWER)] = True
        allowed[3, [CONCISE, VERBOSE]] = True
        allowed[HEAD:, list(FILLER) + [EOS]] = True
        allowed[-1] = False
        allowed[-1, EOS] = True  # the length budget is exhausted: EOS is forced
        return allowed

    def prompt_tokens(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.full_like(prompt_ids, BOS), prompt_ids + FIRST_PROMPT], 1)

    # -- reward -------------------------------------------------------------------------------------
    def is_correct(self, prompt_ids: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        """answers: the answer tokens (vocabulary ids). 1.0 iff one of the prompt's correct answers."""
        correct = torch.as_tensor(self.correct, dtype=torch.long)[prompt_ids] + ANSWER[0]
        return (correct == answers[:, None]).any(1).float()

    # -- base distribution --------------------------------------------------------------------------
    def sample_base(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n task sequences from the base distribution with exact next-token targets.

        Returns tokens (n, L) and targets (n, L-1, V): the true distribution of token t+1 given the prefix
        (rows of zeros after EOS and on the prompt position, which is not modelled).
        """
        k, v, L = self.cfg.n_prompts, self.vocab_size, self.seq_len
        pid = rng.integers(0, k, size=n)
        tmpl_p = np.array([self.cfg.p_template] + [(1 - self.cfg.p_template) / 3] * 3)
        tok = np.full((n, L), PAD)
        tgt = np.zeros((n, L - 1, v), dtype=np.float32)
        tok[:, 0], tok[:, 1] = BOS, pid + FIRST_PROMPT
        t = rng.choice(4, size=n, p=tmpl_p)
        o = rng.integers(0, 2, size=n)
        a = (rng.random(n)[:, None] > self.answer_probs[pid].cumsum(1)).sum(1).clip(max=N_ANSWERS - 1)
        s = rng.integers(0, 2, size=n)
        correct = (self.correct[pid] == a[:, None]).any(1)
        tok[:, 2], tok[:, 3] = np.array(TEMPLATE)[t], np.array(OPENER)[o]
        tok[:, 4], tok[:, 5] = np.array(ANSWER)[a], np.where(s == 1, VERBOSE, CONCISE)
        tgt[:, 1, list(TEMPLATE)] = tmpl_p
        tgt[:, 2, list(OPENER)] = 0.5
        tgt[:, 3, list(ANSWER)] = self.answer_probs[pid]
        tgt[:, 4, [CONCISE, VERBOSE]] = 0.5
        rows = np.arange(n)
        for i in rows:
            h = self.hazard[(bool(correct[i]), bool(s[i]))]
            for f in range(MAX_FILL + 1):
                pos = PROMPT_LEN + HEAD + f  # sequence position of the f-th filler-or-EOS token
                tgt[i, pos - 1, EOS] = h[f]
                tgt[i, pos - 1, list(FILLER)] = (1 - h[f]) / 3
                if rng.random() < h[f]:
                    tok[i, pos] = EOS
                    break
                tok[i, pos] = FILLER[rng.integers(0, 3)]
        return torch.as_tensor(tok), torch.as_tensor(tgt)

    def sample_probes(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n probe sequences [BOS, Q_j, T, O, F x PROBE_FILL, EOS] with exact next-token targets."""
        j, v = self.cfg.n_probe_prompts, self.vocab_size
        L = PROMPT_LEN + 2 + PROBE_FILL + 1
        qid = rng.integers(0, j, size=n)
        tok = np.full((n, L), PAD)
        tgt = np.zeros((n, L - 1, v), dtype=np.float32)
        tok[:, 0], tok[:, 1] = BOS, qid + self.first_probe
        for i in range(n):
            q = qid[i]
            tok[i, 2] = TEMPLATE[rng.choice(4, p=self.probe_template[q])]
            tgt[i, 1, list(TEMPLATE)] = self.probe_template[q]
            tok[i, 3] = OPENER[rng.choice(2, p=self.probe_opener[q])]
            tgt[i, 2, list(OPENER)] = self.probe_opener[q]
            for f in range(PROBE_FILL):
                tok[i, 4 + f] = FILLER[rng.choice(3, p=self.probe_filler[q])]
                tgt[i, 3 + f, list(FILLER)] = self.probe_filler[q]
            tok[i, L - 1] = EOS
            tgt[i, L - 2, EOS] = 1.0
        return torch.as_tensor(tok), torch.as_tensor(tgt)
