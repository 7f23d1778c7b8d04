"""Where one role's actors (learner ranks, rollout replicas) go on a Ray cluster of several nodes.

A `Placement` reserves one placement-group bundle per actor (`resources.learner_placement` /
`rollout_placement`) before any of them starts, so a learner group is packed onto one node or the replicas
are spread over nodes the way the spec says, and adds the role's custom resources
(`resources.learner_custom_resources` / `rollout_custom_resources`) to every actor.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tgc_rl.resources import check_custom_resources

STRATEGIES = {
    "pack": "PACK",
    "strict_pack": "STRICT_PACK",
    "spread": "SPREAD",
    "strict_spread": "STRICT_SPREAD",
}
DEFAULT_TIMEOUT_S = 600.0  # an autoscaling cluster may need minutes to add the nodes a group asks for


class Placement:
    def __init__(
        self,
        job_name: str,
        role: str,
        strategy: str,
        count: int,
        cpus: float,
        gpus: float,
        custom: dict[str, float],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.custom = {k: float(v) for k, v in custom.items() if v > 0}
        self.pg: PlacementGroup | None = None
        check_custom_resources(role, self.custom, ray.cluster_resources())
        if strategy == "none":
            return
        bundle = {k: v for k, v in {"CPU": float(cpus), "GPU": float(gpus), **self.custom}.items() if v > 0}
        if not bundle:
            raise ValueError(
                f"resources.{role}_placement: {strategy} needs each {role} actor to ask for some "
                "resource (CPUs, GPUs or custom ones); a placement group cannot hold empty bundles"
            )
        pg = placement_group(
            [dict(bundle) for _ in range(count)], strategy=STRATEGIES[strategy], name=f"{job_name}-{role}"
        )
        if not pg.wait(timeout_s):
            remove_placement_group(pg)
            raise ValueError(
                f"resources.{role}_placement: {count} bundles of {bundle} ({strategy}) could not be "
                f"placed within {timeout_s:g} s; the cluster's nodes lack room for them "
                f"(see `ray status`)"
            )
        self.pg = pg

    def options(self, index: int) -> dict[str, Any]:
        """Extra Ray actor options for actor `index` of the role (its bundle, its custom resources)."""
        out: dict[str, Any] = {"resources": dict(self.custom)} if self.custom else {}
        if self.pg is not None:
            out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=index, placement_group_capture_child_tasks=False
            )
        return out

    def remove(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:  # already gone with its job, or the cluster is going down
                pass
