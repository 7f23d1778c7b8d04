"""An environment worker process: `python -m tgc_rl.reward.env_worker`, started and killed by `EnvHost`.

It hosts one multi-turn environment at a time (one trajectory), built with the job's task verifier, and
answers the host's calls in frames (`wire.py`): `init` (the task and environment spec) answered by
`ready` or `init_error`, then `call` frames (`reset` a new trajectory's environment for a task item, `step`
it with a model turn's text, `close` it), each answered by one `result`. A step that does not return in
time is the host's to end: it kills this process (tgc_rl/reward/env_host.py).
"""

from __future__ import annotations

import time
from typing import Any

from tgc_rl.reward.env_host import EnvCall, EnvReply
from tgc_rl.reward.worker import serve


class _Hosted:
    """The worker's state: the verifier (built once) and the current trajectory's environment."""

    def __init__(self, spec: dict[str, Any]):
        from tgc_rl.envs import EnvBounds
        from tgc_rl.reward.verifier import Verifier

        self.verifier = Verifier(
            spec["task"], spec["params"], spec["seed"], spec["reward"], frozenset(spec["grants"])
        )
        self.verifier.warm_up()
        self.grants = frozenset(spec["grants"])
        self.name, self.params = spec["env_name"], spec["env_params"]
        self.bounds = EnvBounds.model_validate(spec["env_bounds"])
        self.env: Any = None
        self.ctx: Any = None

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()

    def __call__(self, call: EnvCall) -> EnvReply:
        from tgc_rl.envs import BoundHit, EnvContext, load_env

        try:
            if call.op == "reset":
                self.close()
                item = call.arg
                self.ctx = EnvContext(
                    item,
                    lambda text: self.verifier(item, text),
                    self.bounds,
                    deadline=time.monotonic() + call.time_left,
                )
                self.env = load_env(self.name, self.ctx, self.params, self.grants)
                return EnvReply("ok", tuple(self.env.reset()), self.ctx.tool_calls)
            if call.op == "step":
                if self.env is None:
                    raise RuntimeError("step before reset")
                return EnvReply("ok", self.env.step(call.arg), self.ctx.tool_calls)
            self.close()
            return EnvReply("ok", None)
        except BoundHit as e:
            return EnvReply("bound", (e.reason, e.detail), self.ctx.tool_calls if self.ctx else 0)
        except Exception as e:  # an environment's failure is its trajectory's (`env_error`), not the worker's
            calls = self.ctx.tool_calls if self.ctx else 0
            return EnvReply("error", f"{type(e).__name__}: {e}"[:2000], calls)


def main() -> None:
    serve(_Hosted, lambda hosted, call: hosted(call))


if __name__ == "__main__":
    main()
