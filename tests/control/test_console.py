"""The job console (`/console`) in a real headless Chromium against a real control plane (no Ray): a person
logs in with a token, opens a running job whose trainer reports through the real Reporter and writes traces
through the real TraceWriter, sees the curves and samples change as steps arrive, looks at an older step,
cancels the job; another tenant's token sees nothing of it. Model output shows as text, never as markup."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.browser import CHROMIUM, Browser, log_in_to_console
from tests.proc_helpers import wait_for
from tests.servers import arm, auth
from tgc_rl.batch import Completion
from tgc_rl.config import TracesSpec
from tgc_rl.control.console import SECURITY_HEADERS
from tgc_rl.run_layout import CURVE_PANELS, D7_ENTROPY_MEAN, REWARD_MEAN, JobState
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.loop import Group
from tgc_rl.trainer.reporting import Reporter
from tgc_rl.trainer.traces import TraceWriter

SPEC = {"name": "watched", "steps": 10, "group_size": 2, "prompts_per_step": 2}
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


def test_the_console_is_served_from_the_server_itself_with_a_strict_policy(api_server):
    page = httpx.get(f"{api_server.url}/console", timeout=10)
    assert (
        page.status_code == 200
        and page.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    )
    assert "script-src 'self'" in page.headers["content-security-policy"] and "unsafe" not in page.text
    urls = re.findall(r"""(?:src|href)=["']([^"'#]+)""", page.text)
    assert urls and not [u for u in urls if "//" in u], urls  # nothing from another origin
    for u in urls:
        assert httpx.get(f"{api_server.url}/{u}", timeout=10).status_code == 200, u
    script = httpx.get(f"{api_server.url}/console/console.js", timeout=10).text
    assert "innerHTML" not in script and "http://" not in script.replace("http://www.w3.org/2000/svg", "")
    panels = httpx.get(f"{api_server.url}/console/panels.json", timeout=10).json()
    assert [(p["title"], [(m["name"], m["label"]) for m in p["metrics"]]) for p in panels] == [
        (t, list(series)) for t, series in CURVE_PANELS
    ]


def _groups(step: int) -> list[Group]:
    out = []
    for g in range(2):
        comps = [Completion([g, i], [-0.1, -0.2], "stop", step - 1) for i in range(2)]
        scores = [Score(float(i), "ok", "") for i in range(2)]
        prompt = Prompt(10 * step + g, TaskItem(id=f"{step}.{g}", prompt=f"what is {step}+{g}?"), [1])
        out.append(Group(prompt, comps, scores))
    return out


class Trainer:
    """What a trainer does for the console to show: report steps and keep traces, through the real parts."""

    def __init__(self, api_server, run_dir, job_id: str, secret: str):
        self.reporter = Reporter(run_dir, api_server.url, job_id, secret)
        self.traces = TraceWriter(run_dir, TracesSpec())
        self.reporter.state(JobState.RUNNING, "started", 0)

    def step(self, step: int) -> None:
        decode = lambda ids: f"step {step} answer {ids} {HOSTILE}"  # noqa: E731
        self.traces.add_step(step, _groups(step), [0.5, -0.5] * 2, decode)
        self.traces.flush()
        self.reporter.step(
            step, {REWARD_MEAN: 0.1 * step, "diag/d2_residual": 1e-9 * step, D7_ENTROPY_MEAN: 0.5}
        )


def _job(api_server, job_id: str) -> dict:
    return httpx.get(f"{api_server.url}/v1/jobs/{job_id}", headers=auth(api_server.acme), timeout=10).json()


def _submit(api_server, token: str) -> str:
    r = httpx.post(f"{api_server.url}/v1/jobs", json=SPEC, headers=auth(token), timeout=10)
    r.raise_for_status()
    return r.json()["id"]


def _points(browser: Browser, metric: str) -> int:
    return int(
        browser.js(
            f"(document.querySelector('polyline[data-metric=\"{metric}\"]') || {{dataset: {{}}}})"
            ".dataset.points || '0'"
        )
    )


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
def test_a_tenant_follows_a_running_job_in_the_browser_and_cancels_it(api_server, tmp_path):
    job_id = _submit(api_server, api_server.acme)
    other = _submit(api_server, api_server.globex)
    run_dir = tmp_path / "run"
    trainer = Trainer(api_server, run_dir, job_id, arm(api_server, job_id, run_dir))
    trainer.step(1)
    trainer.step(2)
    with Browser(tmp_path / "profile") as browser:
        log_in_to_console(browser, api_server.url, api_server.acme)
        rows = browser.wait(
            "[...document.querySelectorAll('tr[data-job]')].map(r => r.dataset.job)", 30, "jobs"
        )
        assert job_id in rows and other not in rows  # the tenant's jobs only
        browser.js(f"location.hash = '#/jobs/{job_id}'; true")
        browser.wait(
            f"document.getElementById('job-name').textContent.includes('{job_id}')", 30, "the job page"
        )
        browser.wait(
            f"document.querySelector('polyline[data-metric=\"{REWARD_MEAN}\"]') !== null",
            30,
            "the reward curve",
        )
        assert _points(browser, REWARD_MEAN) == 2
        assert browser.js("document.getElementById('job-state').textContent") == "running"
        browser.wait(
            "document.querySelectorAll('#samples .sample[data-step=\"2\"]').length === 4", 30, "samples"
        )
        browser.screenshot(tmp_path / "console-job-step-2.png")

        trainer.step(3)  # live: the event stream brings the new step without a reload
        browser.wait("document.getElementById('job-step').textContent === '3/10'", 30, "step 3 on the page")
        browser.wait(
            f"document.querySelector('polyline[data-metric=\"{REWARD_MEAN}\"]').dataset.points === '3'",
            30,
            "the curve's third point",
        )
        browser.wait(
            "document.querySelectorAll('#samples .sample[data-step=\"3\"]').length === 4", 30, "step 3"
        )
        assert browser.js("document.getElementById('sample-step').max") == "3"

        # an older step with the slider
        browser.js(
            "const s = document.getElementById('sample-step'); s.value = '1';"
            "s.dispatchEvent(new Event('input')); true"
        )
        browser.wait(
            "document.querySelectorAll('#samples .sample[data-step=\"1\"]').length === 4", 30, "step 1"
        )
        text = browser.text()
        assert "step 1 answer" in text and HOSTILE in text  # the model's markup, shown as the text it is
        assert browser.js("document.querySelectorAll('#samples img, #samples script').length") == 0
        assert browser.js("window.pwned === undefined")
        browser.screenshot(tmp_path / "console-job-step-1.png")

        browser.js("document.getElementById('cancel').click(); true")
        job = wait_for(
            lambda: (j := _job(api_server, job_id)) and j["cancel_requested"] and j, 30, "the cancel"
        )
        assert job["cancel_requested"] and job["cancel_reason"] == "cancelled from the console"
        trainer.step(4)  # the trainer hears of it in the answer to its next report, and stops
        assert trainer.reporter.cancel_requested == "cancelled from the console"
        trainer.reporter.state(JobState.CANCELLED, "cancelled from the console", 4)
        browser.wait(
            "document.getElementById('job-state').textContent === 'cancelled'", 30, "the cancelled state"
        )
        assert browser.js("document.getElementById('cancel').hidden")
        browser.screenshot(tmp_path / "console-job-cancelled.png")

        # another tenant: not in its list, and the job's page is a 404
        log_in_to_console(browser, api_server.url, api_server.globex)
        rows = browser.wait(
            "[...document.querySelectorAll('tr[data-job]')].map(r => r.dataset.job)", 30, "jobs"
        )
        assert other in rows and job_id not in rows
        browser.js(f"location.hash = '#/jobs/{job_id}'; true")
        browser.wait("document.getElementById('error').textContent.startsWith('404')", 30, "a 404")
        assert "step 1 answer" not in browser.text()
    trainer.traces.close()


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
def test_a_refused_token_returns_to_the_login_form(api_server, tmp_path):
    with Browser(tmp_path / "profile") as browser:
        log_in_to_console(browser, api_server.url, "tgc_not-a-token")
        browser.wait("document.getElementById('login-error').textContent.includes('401')", 30, "the refusal")
        assert browser.js("sessionStorage.getItem('tgc-token')") is None
