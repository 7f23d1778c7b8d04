"""Shared-prompt forward: each group's rows packed into one token tree, so shared tokens are computed once.

The rows of a group repeat one prompt, and often the first tokens of their answers. The full forward computes
those tokens once per row; here each run of adjacent rows with the same prompt becomes one sequence holding
the prompt once and its responses as a prefix tree (a token that several responses share at the same context
is one node). A node attends to its ancestors, i.e. exactly the context it has in its own row, and sits at
the position it has there, so every hidden state equals the full forward's (up to float rounding) and
backpropagation through the tree sums the gradients of the copies into the shared node: the same parameter
gradient (Prefix Grouper, arXiv 2506.05433, generalised from the prompt to every shared prefix). A token's
log-prob is read from its parent node, so tokens the copies share get bit-identical log-probs.

Nodes are numbered depth-first, so a node's subtree is the index range [node, subtree_end) and the attention
mask is two comparisons. The dense mask (L x L per group) serves short trees; longer ones run the block
kernel of tgc_rl/learner/tree_attention.py from the subtree ends alone, in memory linear in L.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Decoder families whose attention is plain causal self-attention over position ids, which a 4D mask
# describes completely (no sliding window, no per-layer mask variants).
TREE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def supports_prefix_tree(lm: PreTrainedModel) -> bool:
    """Whether `lm` computes the same hidden states from a packed tree with a 4D mask as from its rows."""
    cfg = lm.config
    if cfg.model_type not in TREE_MODEL_TYPES or cfg._attn_implementation not in (
        "sdpa",
        "eager",
        "tgc_tree",
    ):
        return False
    window = getattr(cfg, "sliding_window", None)
    return not (window and getattr(cfg, "use_sliding_window", True))


@dataclass(frozen=True)
class PackedTrees:
    input_ids: (
        Tensor  # (k, L): one tree per run of rows with the same prompt, nodes depth-first, then padding
    )
    position_ids: Tensor  # (k, L): a node's position in its rows (prompt 0..p-1, response token t at p + t)
    subtree_end: (
        Tensor  # (k, L): one past a node's last descendant; padding: itself + 1 (attends only itself)
    )
    source: Tensor  # (N,): flat index into (k * L) of the node that predicts each response-mask token
    targets: Tensor  # (N,): the token ids, in the row-major order of the response mask
    nodes: int  # real nodes over all trees: the tokens the forward computes (the full forward: every row's)

    def attention_mask(self, eager: bool) -> Tensor:
        """(k, 1, L, L): query a sees key b iff b is an ancestor of a or a itself. Boolean for SDPA, additive
        float for eager attention."""
        L = self.input_ids.shape[1]
        idx = torch.arange(L, device=self.input_ids.device)
        mask = (idx[None, :] <= idx[:, None])[None] & (idx[None, :, None] < self.subtree_end[:, None, :])
        mask = mask[:, None]
        if not eager:
            return mask
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(
            ~mask, torch.finfo(torch.float32).min
        )

    def to(self, device: torch.device) -> PackedTrees:
        return PackedTrees(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.subtree_end.to(device),
            self.source.to(device),
            self.targets.to(device),
            self.nodes,
        )


def pack_trees(
    input_ids: Tensor, attention_mask: Tensor, prompt_len: int, response_mask: Tensor
) -> PackedTrees | None:
    """The micro-batch as token trees, or None where nothing is shared (no two adjacent rows with one prompt),
    the response mask is empty, or a row's tokens are not one contiguous span (left-padded prompt,
    right-padded response, as tgc_rl.batch.collate builds them): the full forward then runs instead."""
    ids, attn, rmask = input_ids.cpu(), attention_mask.cpu().bool(), response_mask.cpu().bool()
    B, P = ids.shape[0], prompt_len
    T = ids.shape[1] - P
    if not bool(rmask.any()):
        return None
    p_len, r_len = attn[:, :P].sum(1), attn[:, P:].sum(1)
    cols_p, cols_r = torch.arange(P), torch.arange(T)
    if not (
        torch.equal(attn[:, :P], cols_p[None] >= P - p_len[:, None])
        and torch.equal(attn[:, P:], cols_r[None] < r_len[:, None])
    ):
        return None
    prompts = ids[:, :P] * attn[:, :P]
    same = (prompts[1:] == prompts[:-1]).all(1) & (p_len[1:] == p_len[:-1])
    starts = [0, *(i + 1 for i in same.logical_not().nonzero().flatten().tolist()), B]
    if len(starts) - 1 == B:
        return None
    trees, sources = [], []
    ids_l, p_l, r_l, m_l = ids.tolist(), p_len.tolist(), r_len.tolist(), rmask.tolist()
    for r0, r1 in zip(starts[:-1], starts[1:], strict=True):
        tree, src = _tree(ids_l, p_l[r0], P, r0, r1, r_l, m_l)
        sources.append(src)
        trees.append(tree)
    L = max(len(t[0]) for t in trees)
    k = len(trees)
    out_ids = torch.zeros(k, L, dtype=torch.long)
    out_pos = torch.zeros(k, L, dtype=torch.long)
    out_end = torch.arange(1, L + 1).repeat(k, 1)
    for j, (tok, pos, end) in enumerate(trees):
        n = len(tok)
        out_ids[j, :n] = torch.tensor(tok)
        out_pos[j, :n] = torch.tensor(pos)
        out_end[j, :n] = torch.tensor(end)
    source = torch.tensor([j * L + s for j, src in enumerate(sources) for s, _ in src], dtype=torch.long)
    target = torch.tensor([t for src in sources for _, t in src], dtype=torch.long)
    return PackedTrees(out_ids, out_pos, out_end, source, target, sum(len(t[0]) for t in trees))


def _tree(
    ids: list[list[int]], p: int, P: int, r0: int, r1: int, r_len: list[int], rmask: list[list[bool]]
) -> tuple[tuple[list[int], list[int], list[int]], list[tuple[int, int]]]:
    """One group's tree: (tokens, positions, subtree ends) in depth-first order, and per response-mask token
    (row-major) the (node that predicts it, token id)."""
    tokens = ids[r0][P - p : P]  # the prompt: a chain, nodes 0..p-1
    parent = list(range(-1, p - 1))
    depth = list(range(p))
    children: list[dict[int, int]] = [{tokens[i + 1]: i + 1} for i in range(p - 1)] + [{}]
    paths = []
    for i in range(r0, r1):
        node, path = p - 1, []
        for t in range(r_len[i]):
            tok = ids[i][P + t]
            child = children[node].get(tok)
            if child is None:
                child = len(tokens)
                tokens.append(tok)
                parent.append(node)
                depth.append(p + t)
                children.append({})
                children[node][tok] = child
            path.append(child)
            node = child
        paths.append(path)
    # Depth-first renumbering: a subtree becomes a contiguous index range.
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children[node].values()))
    new = [0] * len(order)
    for k, node in enumerate(order):
        new[node] = k
    size = [1] * len(order)
    for node in reversed(order):
        if parent[node] >= 0:
            size[parent[node]] += size[node]
    n = len(order)
    end = [0] * n
    tok_out, pos_out = [0] * n, [0] * n
    for node in range(n):
        k = new[node]
        tok_out[k], pos_out[k], end[k] = tokens[node], depth[node], k + size[node]
    src = []
    for i, path in zip(range(r0, r1), paths, strict=True):
        for t, node in enumerate(path):
            if rmask[i][t]:
                src.append((new[parent[node]], tokens[node]))
    return (tok_out, pos_out, end), src
