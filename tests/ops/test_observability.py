"""What an operator watches, tested for real while one tiny job runs under the control plane (`tgc serve`
with its managed Ray head):

- Ray's state API lists the job's actors under names that say job and role;
- headless Chromium shows them on the Ray dashboard's actors page (ray-dashboard-actors.png in the module's
  tmp dir);
- a real Prometheus (Debian's package) on loopback scrapes the control plane (with the metrics token), every
  Ray node (found through the dashboard's service discovery) and the sandbox service, and every query of
  the Grafana dashboard (helm/tgc-rl/dashboards/tgc-rl.json) returns data, and it evaluates the alert rules
  (helm/tgc-rl/alerts) on the job's series without an error, the cancellation alert quiet for its cp_grpo.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.browser import CHROMIUM, Browser, log_in_to_console
from tests.ops.raynodes import state_api
from tests.proc_helpers import wait_for
from tests.specs import tiny_model
from tgc_rl.control.local import LocalControlPlane, free_port
from tgc_rl.control.ray_cluster import LocalRayCluster
from tgc_rl.sdk import Client

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm" / "tgc-rl" / "dashboards" / "tgc-rl.json"
RULES = ROOT / "helm" / "tgc-rl" / "alerts" / "tgc-rl.rules.yaml"
PROMETHEUS = shutil.which("prometheus")
JOB = "obs"
ROLES = (f"{JOB}-learner-0", f"{JOB}-rollout-0", f"{JOB}-reward-0")
# Grafana's variables as the dashboard opens: every job, and a rate window of four scrape intervals.
VARIABLES = {"$job_id": ".*", "$__rate_interval": "20s"}


def job_spec() -> dict:
    return {
        "name": JOB,
        "model": tiny_model(),
        "resources": {"rollout_engine": "hf"},
        # near-greedy: a group's responses share openings, so D2 has nodes to measure (random text has none)
        "group_size": 2,
        "prompts_per_step": 2,
        "sampling": {"max_new_tokens": 8, "temperature": 0.02},
        # long enough to look at while it runs; the fixture cancels it once the tests are done
        "steps": 200,
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "task": {"reward_workers": 1},
    }


# A panel whose description starts so is fed only by jobs of that kind (this module's job is a plain
# single-turn one): its queries are not expected to return data here.
FED_BY_SOME_JOBS = ("Multi-turn jobs only", "Overlong-handling jobs only", "Async jobs only")


def fed_by_every_job(panel: dict) -> bool:
    return not panel.get("description", "").startswith(FED_BY_SOME_JOBS)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables filled in) for every target of every panel that a running
    single-turn job feeds."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in filter(fed_by_every_job, dash["panels"]):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def _kill_session(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)


class Stack:
    """Control plane + managed Ray head + sandbox service + Prometheus, and one running job."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.metrics_token = secrets.token_hex(24)
        (root / "metrics-token").write_text(self.metrics_token)
        self.plane = LocalControlPlane(
            root / "data",
            ray_address="local",
            env={"TGC_METRICS_TOKEN": self.metrics_token, "RAY_metrics_report_interval_ms": "1000"},
        )
        self.head = LocalRayCluster(root / "data")

    def start(self) -> None:
        self.plane.start()
        self.plane.wait_ready()
        self.sandbox_port = free_port()
        self._spawn(
            "sandbox",
            [
                sys.executable,
                "-m",
                "tgc_rl.sandbox.http",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.sandbox_port),
            ],
        )
        wait_for(
            lambda: self._answers(f"http://127.0.0.1:{self.sandbox_port}/metrics/"), 120, "sandbox service"
        )
        ran = httpx.post(
            f"http://127.0.0.1:{self.sandbox_port}/run_code",
            timeout=60,
            json={"code": "print(6 * 7)", "language": "python"},
        ).json()
        assert ran["run_result"]["stdout"].strip() == "42", ran
        self.start_prometheus()
        self.token = self.plane.create_token("ops")
        self.client = Client(self.plane.url, self.token)
        self.started = time.time()
        self.job = self.client.submit(job_spec())

    def start_prometheus(self) -> None:
        port = urlparse_port(self.head.dashboard_url)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "5s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "tgc-control-plane",
                    "static_configs": [{"targets": [f"127.0.0.1:{self.plane.port}"]}],
                    "authorization": {"type": "Bearer", "credentials_file": str(self.root / "metrics-token")},
                },
                {
                    "job_name": "ray",
                    "http_sd_configs": [
                        {
                            "url": f"http://127.0.0.1:{port}/api/prometheus/sd",
                            "refresh_interval": "5s",
                            "authorization": {
                                "type": "Bearer",
                                "credentials_file": str(self.head.token_file),
                            },
                        }
                    ],
                    # Ray names its nodes by their interface address; everything here is on this host's loopback
                    "relabel_configs": [
                        {
                            "source_labels": ["__address__"],
                            "regex": ".*:(\\d+)",
                            "target_label": "__address__",
                            "replacement": "127.0.0.1:$1",
                        }
                    ],
                },
                {
                    "job_name": "sandbox",
                    "metrics_path": "/metrics/",
                    "static_configs": [{"targets": [f"127.0.0.1:{self.sandbox_port}"]}],
                },
            ],
        }
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.prom = f"http://127.0.0.1:{free_port()}"
        self._spawn(
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={self.root / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.root / 'tsdb'}",
                f"--web.listen-address={self.prom.removeprefix('http://')}",
            ],
        )
        wait_for(lambda: self._answers(f"{self.prom}/-/ready"), 60, "Prometheus ready")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
            )

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            return httpx.get(url, timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    def step(self) -> int:
        return self.job.refresh().step or 0

    def query_range(self, expr: str) -> list[dict]:
        r = httpx.get(
            f"{self.prom}/api/v1/query_range",
            timeout=30,
            params={"query": expr, "start": self.started - 5, "end": time.time(), "step": "2"},
        )
        r.raise_for_status()
        return r.json()["data"]["result"]

    def stop(self) -> None:
        try:
            if getattr(self, "job", None) is not None:
                if self.job.refresh().state not in ("succeeded", "failed", "cancelled"):
                    self.job.cancel()  # the console test cancels it from the browser
                self.job.wait(timeout=180)
                self.client.close()
        finally:
            for proc in self.procs:
                _kill_session(proc)
            self.plane.stop()
            self.head.stop()


def urlparse_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("Debian's prometheus is not installed (scripts/setup.sh installs it)")
    s = Stack(tmp_path_factory.mktemp("observability"))
    try:
        s.start()
        wait_for(lambda: s.step() >= 1, 600, "the job's first step")
        yield s
    finally:
        s.stop()


def _alive_actors(stack: Stack) -> dict[str, dict]:
    return {
        a["name"]: a
        for a in state_api(stack.head.dashboard_url, stack.head.token_file, "actors")
        if a.get("name") and a["state"] == "ALIVE"
    }


def test_each_actor_of_a_running_job_is_named_for_its_job_and_role(stack):
    actors = _alive_actors(stack)
    mine = {name: a for name, a in actors.items() if name.startswith(f"{JOB}-")}
    assert set(ROLES) <= set(mine), sorted(actors)
    assert stack.job.refresh().state.value == "running"
    assert mine[f"{JOB}-learner-0"]["class_name"] == "_LearnerRank"
    assert mine[f"{JOB}-rollout-0"]["class_name"] == "RolloutActor"
    # every actor of this job (one Ray job) carries the job's name and a role
    ray_job = mine[f"{JOB}-learner-0"]["job_id"]
    same_job = [
        a
        for a in state_api(stack.head.dashboard_url, stack.head.token_file, "actors")
        if a["job_id"] == ray_job and a["state"] == "ALIVE"
    ]
    assert same_job and all(a["name"] in mine for a in same_job), [
        (a["class_name"], a["name"]) for a in same_job
    ]


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
def test_ray_dashboard_actors_page_shows_the_job_s_actors(stack, tmp_path):
    with Browser(tmp_path / "chromium-profile", width=1600) as browser:
        # what a person does once: paste the head's Ray token, which the dashboard keeps as this cookie
        browser.cdp("Network.enable")
        browser.cdp(
            "Network.setCookie",
            name="ray-authentication-token",
            value=stack.head.token,
            url=stack.head.dashboard_url,
            httpOnly=True,
        )
        browser.navigate(f"{stack.head.dashboard_url}/#/actors")
        text = ""
        try:
            text = wait_for(
                lambda: (t := browser.text()) and all(r in t for r in ROLES) and t,
                120,
                "the job's actors on the dashboard's actors page",
            )
        finally:
            shot = browser.screenshot(stack.root / "ray-dashboard-actors.png")  # kept: what a person sees
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
    assert "ALIVE" in text and "RolloutActor" in text


def test_every_grafana_dashboard_query_returns_data(stack):
    queries = dashboard_queries()
    assert len(queries) >= 15
    panels = json.loads(DASHBOARD.read_text())["panels"]
    others = [p for p in panels if not fed_by_every_job(p)]
    # only the multi-turn row's panels, the overlong panel and the async-only off-policy panel are left out, and
    # they read only their own metrics
    assert len(others) == 8, [p["title"] for p in others]
    async_only = ("objective/behaviour/coef_mean", "mismatch/shared_pairs", "rollout/stale_dropped")
    assert all(
        name.startswith(("multi_turn/", "overlong/", "timing/env_s", *async_only))
        for p in others
        for t in p["targets"]
        for name in re.findall(r'metric=~"([^"]+)"', t["expr"])[0].split("|")
    ), others
    wait_for(lambda: stack.step() >= 3, 600, "three steps")

    def missing() -> list[tuple[str, str]]:
        return [(title, expr) for title, expr in queries if not stack.query_range(expr)]

    try:
        wait_for(lambda: not missing(), 180, "data for every dashboard query", every=5)
    except TimeoutError:
        names = httpx.get(f"{stack.prom}/api/v1/label/__name__/values", timeout=30).json()["data"]
        targets = httpx.get(f"{stack.prom}/api/v1/targets", timeout=30).json()["data"]["activeTargets"]
        pytest.fail(
            f"no data for {missing()}\nmetrics: {[n for n in names if 'tgc' in n]}\n"
            f"targets: {[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}"
        )
    assert stack.job.refresh().state.value == "running"


def test_alert_rules_evaluate_on_the_running_job_and_cancellation_holds(stack):
    wait_for(lambda: stack.step() >= 2, 600, "two steps")

    def evaluated() -> list[dict]:
        groups = httpx.get(f"{stack.prom}/api/v1/rules", timeout=30).json()["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    wait_for(lambda: all(r["lastEvaluation"][:4] != "0001" for r in evaluated()), 120, "every rule evaluated")
    rules = {r["name"]: r for r in evaluated()}
    assert len(rules) == 7 and {r["health"] for r in rules.values()} == {"ok"}, rules
    # the cancellation rule's join holds on the job's real labels: with its threshold at 0 it finds the job
    # (cp_grpo claims cancellation), with the shipped one (1e-4) it stays quiet: D2 is float rounding
    expr = rules["TgcCancellationBroken"]["query"]
    assert "> 0.0001" in expr
    joined = httpx.get(
        f"{stack.prom}/api/v1/query", timeout=30, params={"query": expr.replace("> 0.0001", ">= 0")}
    )
    assert [r["metric"]["job_id"] for r in joined.json()["data"]["result"]] == [stack.job.id]
    assert (
        rules["TgcCancellationBroken"]["state"] == "inactive"
        and rules["TgcServerErrors"]["state"] == "inactive"
    )


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
def test_the_browser_console_follows_the_running_job_and_cancels_it(stack, tmp_path):
    """Last in this module: it cancels the job. The console shows the Ray-run trainer's steps, curves and
    samples as they arrive, and its cancel button stops the job."""
    job = stack.job.id
    curve = "document.querySelector('polyline[data-metric=\"reward/mean\"]')"
    with Browser(tmp_path / "profile") as browser:
        log_in_to_console(browser, stack.plane.url, stack.token)
        browser.wait(f"document.querySelector('tr[data-job=\"{job}\"]') !== null", 60, "the job in the list")
        browser.js(f"location.hash = '#/jobs/{job}'; true")
        points = int(browser.wait(f"{curve} && {curve}.dataset.points", 60, "the reward curve"))
        traced = int(
            browser.wait(
                "document.querySelectorAll('#samples .sample').length && "
                "document.getElementById('sample-step').max",
                60,
                "samples",
            )
        )
        # live: later steps reach the page without a reload
        browser.wait(f"Number({curve}.dataset.points) > {points}", 300, "a later step on the curve")
        browser.wait(
            f"Number(document.getElementById('sample-step').max) > {traced}", 300, "a later step's samples"
        )
        browser.screenshot(stack.root / "console-running-job.png")
        browser.js("document.getElementById('cancel').click(); true")
        browser.wait(
            "document.getElementById('job-state').textContent === 'cancelled'", 300, "the job cancelled"
        )
        browser.screenshot(stack.root / "console-cancelled-job.png")
    assert stack.job.refresh().state == "cancelled" and "console" in stack.job.refresh().reason
