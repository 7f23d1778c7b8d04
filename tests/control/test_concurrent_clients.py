"""20 concurrent clients, 200 submissions + 200 reads on a real server (SQLite): nothing lost, no duplicates."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx

CLIENTS = 20
KEYS = 100  # each key is submitted by two different clients, concurrently


def test_concurrent_submissions_and_reads_lose_nothing_and_never_duplicate_a_key(api_server):
    token = api_server.cp.create_token("busy")
    headers = {"Authorization": f"Bearer {token}"}
    # Two submissions per key, spread so that both copies of a key run on different clients at once.
    work = [(f"key-{k}", c) for c in range(2) for k in range(KEYS)]
    random.Random(0).shuffle(work)
    lanes: list[list[str]] = [[] for _ in range(CLIENTS)]
    for i, (key, _) in enumerate(work):
        lanes[i % CLIENTS].append(key)

    def client(keys: list[str]) -> list[tuple[str, str, int, str]]:
        out = []
        with httpx.Client(base_url=api_server.url, headers=headers, timeout=60) as http:
            for key in keys:
                r = http.post("/v1/jobs", json={"name": key, "steps": 2}, headers={"Idempotency-Key": key})
                assert r.status_code in (200, 201), r.text
                job_id = r.json()["id"]
                read = http.get(f"/v1/jobs/{job_id}")
                assert read.status_code == 200 and read.json()["name"] == key
                out.append((key, job_id, r.status_code, read.json()["id"]))
        return out

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = [row for lane in pool.map(client, lanes) for row in lane]

    assert len(results) == 2 * KEYS
    by_key: dict[str, set[str]] = {}
    for key, job_id, _, read_id in results:
        assert read_id == job_id
        by_key.setdefault(key, set()).add(job_id)
    assert len(by_key) == KEYS and all(len(ids) == 1 for ids in by_key.values())
    assert sum(1 for *_, status, _ in results if status == 201) == KEYS  # one creation per key, one replay

    listed = httpx.get(
        f"{api_server.url}/v1/jobs", params={"limit": 500}, headers=headers, timeout=60
    ).json()["jobs"]
    assert sorted(j["name"] for j in listed) == sorted(by_key)
    assert {j["id"] for j in listed} == {next(iter(ids)) for ids in by_key.values()}
