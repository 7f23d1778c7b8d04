"""What a hostile upload may cost the control plane: bounded, refused with a 4xx that names the row, column or
limit, never a crash or a 5xx; duplicates and races leave nothing behind; quotas (issue 28)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.proc_helpers import wait_until
from tests.servers import auth
from tgc_rl.control.local import LocalControlPlane


def _post(server, token: str, name: str, body: bytes, timeout: float = 120) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/datasets", params={"name": name}, content=body, headers=auth(token), timeout=timeout
    )


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _parquet(table: pa.Table, **kw) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **kw)
    return sink.getvalue().to_pybytes()


def _staged(server) -> list[str]:
    root = server.cp.data_dir / "datasets"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _staging(server) -> list[str]:
    """The staging folders of uploads in flight (or left behind)."""
    return [n for n in _staged(server) if n.startswith(".staging-")]


# -- the crash input (defect 1) -------------------------------------------------------------------------
def test_a_row_nested_20000_levels_is_refused_and_the_server_keeps_answering(api_server):
    deep = ("[" * 20_000 + "]" * 20_000 + "\n").encode()  # ~40 KB; killed `tgc serve` with SIGSEGV
    for body in (deep, b'{"prompt": "p", "answer": ' + b"{" * 20_000 + b"}" * 20_000 + b"}\n"):
        r = _post(api_server, api_server.acme, "deep.jsonl", body)
        assert r.status_code == 422, r.text
        assert "row 1: JSON nested" in r.json()["message"] and "more than 64" in r.json()["message"]
    assert api_server.cp.proc.poll() is None
    r = httpx.get(f"{api_server.url}/v1/datasets", headers=auth(api_server.globex), timeout=10)
    assert r.status_code == 200  # another tenant is still served


# -- memory bombs (defect 2) ----------------------------------------------------------------------------
_MIB = "x" * (1 << 20)
BOMBS = {
    # 256 rows naming one 1 MiB string through a dictionary: a few hundred bytes, 256 MiB decoded
    "dict.parquet": (
        lambda: _parquet(
            pa.table({"prompt": pa.array([_MIB] * 256).dictionary_encode()}), compression="zstd"
        ),
        "decodes to more than 67,108,864 bytes",
    ),
    # 5 million null rows, run-length encoded: ~11 KB
    "nulls.parquet": (
        lambda: _parquet(
            pa.table({"prompt": pa.nulls(5_000_000, pa.string())}),
            compression="zstd",
            row_group_size=5_000_000,
        ),
        "more than 1,000,000 rows",
    ),
    # every row a new key: rows x keys cells
    "keys.jsonl": (
        lambda: "".join(json.dumps({f"k{i}": 1}) + "\n" for i in range(2000)).encode(),
        "more than 256, this server's limit (dataset_max_columns)",
    ),
    "wide.csv": (
        lambda: (",".join(f"c{i}" for i in range(100_000)) + "\n" + ",".join("1" * 100_000) + "\n").encode(),
        "100,000 columns, more than 256",
    ),
}


def test_memory_bombs_are_refused_quickly_and_the_server_does_not_grow(api_server):
    bodies = {name: make() for name, (make, _) in BOMBS.items()}
    assert len(bodies["dict.parquet"]) < 2000 and len(bodies["nulls.parquet"]) < 20_000
    pid = api_server.cp.proc.pid
    _post(api_server, api_server.acme, "warm.jsonl", b'{"prompt": "p", "answer": "1"}\n')  # imports, pools
    before = _rss_kib(pid)
    for name, body in bodies.items():
        started = time.monotonic()
        r = _post(api_server, api_server.acme, name, body)
        assert r.status_code == 422, (name, r.text)
        assert BOMBS[name][1] in r.json()["message"], (name, r.json()["message"])
        assert time.monotonic() - started < 20, name
    assert _rss_kib(pid) - before < 40 * 1024  # KiB: the parsing happened elsewhere
    assert api_server.cp.proc.poll() is None


# -- conversion errors are 422 naming row and column (defect 4) ------------------------------------------
def _bad_utf8_parquet() -> bytes:
    strings = pa.array([b"fine", b"bad \xff"], pa.binary()).view(pa.string())
    return _parquet(pa.table({"prompt": strings, "answer": ["1", "2"]}))


CONVERSION = {
    "u.jsonl": (
        b'{"prompt": "a", "answer": "1"}\n{"prompt": "b\xff", "answer": "2"}\n',
        "row 2, column 'prompt'",
    ),
    "h.csv": (b"prompt,ans\xffwer\na,1\n", "header, column 2"),
    "c.csv": (b"prompt,answer\na,1\nb,\xfe2\n", "row 2, column 'answer'"),
    "u.parquet": (_bad_utf8_parquet(), "row 2, column 'prompt'"),
    "ts.parquet": (
        _parquet(
            pa.table(
                {
                    "prompt": ["a", "b"],
                    "answer": ["1", "2"],
                    "when": pa.array([0, 400_000_000_000_000], pa.timestamp("s")),
                }
            )
        ),
        "row 2, column 'when'",
    ),
    "d.parquet": (
        _parquet(pa.table({"prompt": ["a", "b"], "day": pa.array([1, 2_000_000_000], pa.date32())})),
        "row 2, column 'day'",
    ),
}


@pytest.mark.parametrize("name", sorted(CONVERSION))
def test_values_that_do_not_convert_are_422_naming_row_and_column(api_server, name):
    body, where = CONVERSION[name]
    r = _post(api_server, api_server.acme, name, body)
    assert r.status_code == 422, r.text
    assert where in r.json()["message"]


# -- files no job can use (defect 7's upload part) --------------------------------------------------------
UNUSABLE = {
    "empty-rows.jsonl": (b"{}\n{}\n", "no columns"),
    "no-header.csv": (b"\na,1\n", "no columns"),
    "dup.csv": (b"prompt,answer,prompt\na,1,b\n", "the column 'prompt' appears twice"),
    "dup.jsonl": (b'{"prompt": "a", "answer": "1", "prompt": "b"}\n', "the key 'prompt' appears twice"),
    "dup.parquet": (
        _parquet(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["prompt", "prompt"])),
        "the column 'prompt' appears twice",
    ),
    "long.jsonl": (
        json.dumps({"prompt": "x" * ((1 << 20) + 1), "answer": "1"}).encode(),
        "row 1, column 'prompt': a text of 1,048,577 characters, more than 1,048,576",
    ),
}


@pytest.mark.parametrize("name", sorted(UNUSABLE))
def test_files_no_job_can_use_are_refused_at_upload(api_server, name):
    body, why = UNUSABLE[name]
    r = _post(api_server, api_server.acme, name, body)
    assert r.status_code == 422, r.text
    assert why in r.json()["message"]


# Hypothesis: encoded inputs of each format, valid or broken, never make the upload answer 5xx
_TEXT = st.text(st.characters(codec="utf-8"), max_size=20) | st.binary(max_size=20).map(
    lambda b: b.decode("utf-8", "surrogateescape")
)
_ROWS = st.lists(
    st.dictionaries(st.sampled_from(["prompt", "answer", "x"]), _TEXT | st.integers() | st.none()),
    min_size=1,
    max_size=5,
)


def _encode(fmt: str, rows: list[dict], noise: bytes) -> bytes:
    if fmt == "jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        return text.encode("utf-8", "surrogateescape") + noise
    if fmt == "csv":
        cols = sorted({k for r in rows for k in r}) or ["prompt"]
        lines = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
        return "\n".join(lines).encode("utf-8", "surrogateescape") + noise
    cols = sorted({k for r in rows for k in r}) or ["prompt"]
    arrays = [
        pa.array([str(r.get(c, "")).encode("utf-8", "surrogateescape") for r in rows], pa.binary()).view(
            pa.string()
        )
        for c in cols
    ]
    body = _parquet(pa.Table.from_arrays(arrays, names=cols))
    return body[: len(body) - len(noise)] + noise if noise else body


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(["jsonl", "csv", "parquet"]), rows=_ROWS, noise=st.binary(max_size=8))
def test_encoded_inputs_never_answer_5xx(api_server, fmt, rows, noise):
    r = _post(api_server, api_server.acme, f"h.{fmt}", _encode(fmt, rows, noise))
    assert r.status_code in (200, 201, 422), r.text


# -- duplicates, races, quotas, concurrency ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tight_server(tmp_path_factory):
    """A server with small quotas, no per-tenant upload limit, one inspection slot that uploads queue for."""
    cp = LocalControlPlane(
        tmp_path_factory.mktemp("tight"),
        ray_address="none",
        env={
            "TGC_DATASET_QUOTA_COUNT": "3",
            "TGC_DATASET_QUOTA_BYTES": "200000",
            "TGC_DATASET_UPLOADS_PER_TENANT": "0",
            "TGC_DATASET_INSPECT_CONCURRENCY": "1",
            "TGC_DATASET_INSPECT_QUEUE_S": "60",
        },
    )
    tokens = {t: cp.create_token(t) for t in ("acme", "globex", "initech")}
    with cp:
        yield cp, tokens


class _Server:
    def __init__(self, cp: LocalControlPlane):
        self.url, self.cp = cp.url, cp


def test_duplicates_and_racing_identical_uploads_return_one_dataset_and_leave_nothing(tight_server):
    cp, tokens = tight_server
    server = _Server(cp)
    body = b"".join(
        json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}).encode() + b"\n" for i in range(50)
    )
    first = _post(server, tokens["acme"], "race.jsonl", body)
    assert first.status_code == 201
    again = _post(server, tokens["acme"], "race.jsonl", body)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert _staged(server) == [first.json()["id"]]  # the duplicate's staged copy is gone
    other = body + b'{"prompt": "last", "answer": "x"}\n'
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _post(server, tokens["acme"], "race2.jsonl", other), range(8)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 7 + [201], [a.text for a in answers]
    ids = {a.json()["id"] for a in answers}
    assert len(ids) == 1
    assert sorted(_staged(server)) == sorted([first.json()["id"], *ids])  # no orphans, nothing staged


def test_tenant_quotas_name_the_limit_and_a_duplicate_at_the_quota_is_still_the_dataset(tight_server):
    cp, tokens = tight_server
    server = _Server(cp)
    made = []
    for i in range(3):
        r = _post(
            server, tokens["globex"], f"q{i}.jsonl", json.dumps({"prompt": f"q{i}", "answer": "1"}).encode()
        )
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
    r = _post(server, tokens["globex"], "q3.jsonl", b'{"prompt": "q3", "answer": "1"}')
    assert r.status_code == 409 and r.json()["error"] == "quota_exceeded"
    assert "keeps 3 datasets" in r.json()["message"] and "dataset_quota_count" in r.json()["message"]
    assert (
        _post(server, tokens["globex"], "q0.jsonl", b'{"prompt": "q0", "answer": "1"}').json()["id"]
        == made[0]
    )
    big = b"".join(json.dumps({"prompt": "p" * 900, "answer": str(i)}).encode() + b"\n" for i in range(150))
    assert _post(server, tokens["initech"], "big.jsonl", big).status_code == 201
    r = _post(server, tokens["initech"], "big2.jsonl", big + b'{"prompt": "more", "answer": "1"}\n')
    assert r.status_code == 409 and "dataset_quota_bytes" in r.json()["message"]
    assert "200,000 bytes" in r.json()["message"]


def test_a_full_inspection_pool_answers_503_and_a_tenant_429_beyond_its_uploads_in_flight(tmp_path):
    cp = LocalControlPlane(
        tmp_path / "busy",
        ray_address="none",
        env={"TGC_DATASET_INSPECT_CONCURRENCY": "1", "TGC_DATASET_INSPECT_QUEUE_S": "0"},
    )
    acme, globex = cp.create_token("acme"), cp.create_token("globex")
    slow = b"".join(
        json.dumps({"prompt": f"p{i} " * 10, "answer": str(i)}).encode() + b"\n" for i in range(60_000)
    )
    with cp:
        server = _Server(cp)
        result: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: result.append(_post(server, globex, "slow.jsonl", slow)))
        worker.start()
        try:
            tasks = Path(f"/proc/{cp.proc.pid}/task")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                (t / "children").read_text().strip() for t in tasks.iterdir()
            ):
                time.sleep(0.01)  # until the first upload's inspection child runs
            r = _post(server, acme, "other.jsonl", b'{"prompt": "o", "answer": "1"}\n')
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert "inspection slot" in r.json()["message"]
        finally:
            worker.join()
        assert result[0].status_code == 201, result[0].text
        assert not _staging(server)
        # two uploads of one tenant in flight (bodies half sent): a third is 429 before its body is read
        import http.client

        held = []
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", cp.port, timeout=30)
            conn.putrequest("POST", "/v1/datasets?name=held.jsonl")
            conn.putheader("Authorization", f"Bearer {acme}")
            conn.putheader("Content-Length", "64")
            conn.endheaders()
            conn.send(b'{"prompt": "held", ')
            held.append(conn)
        # both hold their slots once their staging folders exist
        assert wait_until(lambda: len(_staging(server)) == 2, timeout=60), _staged(server)
        r = _post(server, acme, "third.jsonl", b'{"prompt": "t", "answer": "1"}\n')
        assert r.status_code == 429 and "dataset_uploads_per_tenant" in r.json()["message"], r.text
        assert _post(server, globex, "g.jsonl", b'{"prompt": "g", "answer": "1"}\n').status_code == 201
        for conn in held:
            conn.close()


# -- the child's rlimits and the sweeper, without a server --------------------------------------------------
def test_the_inspection_child_is_stopped_by_its_memory_and_cpu_limits(tmp_path):
    from tgc_rl.bounded_read import DataError
    from tgc_rl.control.inspection import InspectionLimits, Inspector

    fat = tmp_path / "fat.jsonl"  # one row whose list of 10 million floats needs ~330 MB as Python objects
    fat.write_text('{"prompt": "a", "answer": [' + ",".join(["0.5"] * 10_000_000) + "]}\n")
    inspector = Inspector(InspectionLimits(memory_mb=300))
    with (
        inspector.slot(),
        pytest.raises(DataError, match=r"needs more than 300 MiB.*dataset_inspect_memory_mb"),
    ):
        inspector.inspect(fat, "jsonl", "fat.jsonl")
    many = tmp_path / "many.jsonl"  # ~5 s of CPU
    many.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(500_000)))
    inspector = Inspector(InspectionLimits(cpu_s=1))
    with (
        inspector.slot(),
        pytest.raises(DataError, match=r"needs more than 1 s of CPU.*dataset_inspect_cpu_s"),
    ):
        inspector.inspect(many, "jsonl", "many.jsonl")


def test_stale_staging_folders_and_unrecorded_dataset_folders_are_swept_at_start_up(tmp_path):
    import os

    from tgc_rl.control import db
    from tgc_rl.control.datasets import DatasetStore
    from tgc_rl.control.migrations import migrate

    engine = db.make_engine(f"sqlite:///{tmp_path / 'tgc.db'}")
    migrate(engine)
    root = tmp_path / "datasets"
    names = {
        "stale": ".staging-ds_" + "a" * 32,
        "orphan": "ds_" + "b" * 32,
        "fresh": ".staging-ds_" + "c" * 32,
        "recorded": "ds_" + "d" * 32,
    }
    for key, name in names.items():
        (root / name).mkdir(parents=True)
        (root / name / "x.jsonl").write_text("{}\n")
        if key != "fresh":
            for p in (root / name / "x.jsonl", root / name):
                os.utime(p, (time.time() - 7200, time.time() - 7200))
    with engine.begin() as conn:
        conn.execute(
            db.datasets.insert().values(
                id=names["recorded"],
                tenant="acme",
                name="x.jsonl",
                format="jsonl",
                size_bytes=3,
                sha256="0" * 64,
                rows=1,
                columns="[]",
                created_at=time.time(),
            )
        )
    DatasetStore(engine, root)
    assert sorted(p.name for p in root.iterdir()) == sorted([names["fresh"], names["recorded"]])
    engine.dispose()


def test_the_charts_dataset_values_are_the_servers_defaults_and_reach_it():
    chart = pytest.importorskip("tests.deploy.test_chart")
    from tgc_rl.control.settings import ControlSettings

    def env(values: dict) -> dict[str, str]:
        cp = chart._one(chart.render(values), "Deployment", "control-plane")["spec"]["template"]["spec"]
        return {n: e["value"] for n, e in chart._env(cp["containers"][0]).items() if "value" in e}

    names = [n for n in ControlSettings.model_fields if n.startswith("dataset_")] + ["max_dataset_bytes"]
    defaults, settings = env({}), ControlSettings()
    assert sorted(n for n in defaults if n.removeprefix("TGC_").lower() in names) == sorted(
        f"TGC_{n.upper()}" for n in names
    )
    for n in names:
        assert float(defaults[f"TGC_{n.upper()}"]) == float(getattr(settings, n)), n
    changed = env({"controlPlane": {"datasets": {"quotaBytes": 2**40, "inspectMemoryMb": 2048}}})
    assert (
        changed["TGC_DATASET_QUOTA_BYTES"] == str(2**40)
        and changed["TGC_DATASET_INSPECT_MEMORY_MB"] == "2048"
    )
