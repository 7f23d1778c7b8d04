"""`/v1/datasets` and datasets in job specs: a tenant reads only its own data, never a host path."""

from __future__ import annotations

import pytest

from tgc_rl.sdk import Client, Invalid, NotFound, TooLarge
from tgc_rl.tasks.export import export_rows, write_rows


@pytest.fixture(scope="module")
def gsm_file(tmp_path_factory):
    return write_rows(export_rows("arithmetic", {}, 12), tmp_path_factory.mktemp("d") / "arith.jsonl")


def _spec(params: dict, **extra) -> dict:
    return {"name": "ds", "task": {"name": "dataset", "params": params}, "steps": 1, **extra}


def test_upload_list_get_and_delete_are_per_tenant(api_server, gsm_file):
    with Client(api_server.url, api_server.acme) as acme, Client(api_server.url, api_server.globex) as globex:
        d = acme.upload_dataset(gsm_file)
        assert d.id.startswith("ds_") and d.rows == 12 and d.format == "jsonl"
        assert {"prompt", "answer", "verifier"} <= set(d.columns)
        assert acme.upload_dataset(gsm_file).id == d.id  # the same content is the same dataset
        assert d.id in [x.id for x in acme.datasets()]
        assert d.id not in [x.id for x in globex.datasets()]
        with pytest.raises(NotFound):
            globex.dataset(d.id)
        with pytest.raises(NotFound):
            globex.delete_dataset(d.id)
        assert acme.dataset(d.id).sha256 == d.sha256
        assert globex.upload_dataset(gsm_file).id != d.id  # another tenant's copy is its own
        acme.delete_dataset(d.id)
        with pytest.raises(NotFound):
            acme.dataset(d.id)


def test_a_bad_file_is_refused_at_upload_naming_the_row(api_server, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", answer: 2}\n')
    with Client(api_server.url, api_server.acme) as acme:
        with pytest.raises(Invalid, match=r"bad.jsonl: row 2: not valid JSON"):
            acme.upload_dataset(bad)
        with pytest.raises(Invalid, match=r"end it in .jsonl, .json, .parquet or .csv"):
            acme.upload_dataset(bad, name="bad.exe")
        with pytest.raises(Invalid, match=r"the file is empty"):
            (tmp_path / "empty.jsonl").write_text("")
            acme.upload_dataset(tmp_path / "empty.jsonl")
        assert all(d.name != "bad.jsonl" for d in acme.datasets())


def test_an_upload_over_the_size_limit_is_413(api_server):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(api_server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.putrequest("POST", "/v1/datasets?name=big.jsonl")  # the declared size alone is refused, no body sent
    conn.putheader("Authorization", f"Bearer {api_server.acme}")
    conn.putheader("Content-Length", str(256 * 2**20 + 1))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and b"exceeds the limit of 268435456 bytes" in r.read()
    conn.close()
    with Client(api_server.url, api_server.acme) as acme:
        with pytest.raises(TooLarge):
            acme.request(
                "POST", "/v1/jobs", json={"name": "x" * (2 * 2**20)}
            )  # jobs keep their own 1 MiB limit


def test_a_job_may_name_only_its_own_tenants_datasets(api_server, gsm_file):
    with Client(api_server.url, api_server.acme) as acme, Client(api_server.url, api_server.globex) as globex:
        d = acme.upload_dataset(gsm_file)
        assert acme.validate(_spec({"dataset_id": d.id}))["task"]["params"]["dataset_id"] == d.id
        with pytest.raises(Invalid, match=rf"task.params.dataset_id: no dataset '{d.id}' of yours"):
            globex.submit(_spec({"dataset_id": d.id}))
        with pytest.raises(Invalid, match=r"eval.dataset.dataset_id: no dataset"):
            globex.submit(
                _spec(
                    {"dataset_id": globex.upload_dataset(gsm_file).id}, eval={"dataset": {"dataset_id": d.id}}
                )
            )
        with Client(api_server.url, api_server.admin) as admin:
            assert admin.validate(_spec({"dataset_id": d.id}))


@pytest.mark.parametrize(
    "spec",
    [
        _spec({"path": "/etc/passwd", "prompt_column": "root"}),
        _spec({"dataset_id": "ds_" + "0" * 32, "holdout": 2}, eval={"dataset": {"path": "/etc/shadow"}}),
        _spec({"path": "relative/../../etc/passwd"}),
    ],
)
def test_a_tenants_spec_can_never_name_a_host_path(api_server, spec):
    with Client(api_server.url, api_server.acme) as acme:
        with pytest.raises(Invalid) as e:
            acme.validate(spec)
    assert "paths on the workers' hosts need an admin token" in e.value.message


def test_files_under_a_data_root_need_the_operator_to_configure_one(api_server):
    with Client(api_server.url, api_server.acme) as acme:
        with pytest.raises(Invalid, match=r"task.params.file: this server has no data root"):
            acme.validate(_spec({"file": "train.jsonl"}))
