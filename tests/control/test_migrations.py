import threading

import sqlalchemy as sa

from tgc_rl.control import db
from tgc_rl.control.migrations import MIGRATIONS, current_version, migrate


def _columns(engine: sa.Engine) -> dict[str, set[str]]:
    insp = sa.inspect(engine)
    return {t: {c["name"] for c in insp.get_columns(t)} for t in insp.get_table_names()}


def test_fresh_database_migrates_to_the_schema_the_queries_use(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path}/a.db")
    assert migrate(engine) == [m.version for m in MIGRATIONS]
    expected = {t.name: {c.name for c in t.columns} for t in db.metadata.sorted_tables}
    assert _columns(engine) == expected


def test_migrate_twice_applies_nothing_the_second_time(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path}/a.db")
    migrate(engine)
    assert migrate(engine) == []
    assert current_version(engine) == MIGRATIONS[-1].version


def test_old_database_upgrades_and_keeps_its_rows(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path}/a.db")
    migrate(engine, MIGRATIONS[:1])
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO tenants (name, max_concurrent_jobs, created_at) VALUES ('acme', 3, 1.0)")
        )
    assert "reported_at" not in _columns(engine)["jobs"]
    assert migrate(engine) == [m.version for m in MIGRATIONS[1:]]
    assert "reported_at" in _columns(engine)["jobs"] and "driver_logs" in _columns(engine)
    assert "grants" in _columns(engine)["jobs"]
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT max_concurrent_jobs FROM tenants WHERE name='acme'")).scalar_one()
            == 3
        )


def test_concurrent_migrations_apply_each_step_once(tmp_path):
    url = f"sqlite:///{tmp_path}/a.db"
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(db.make_engine(url)))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    applied = sorted(v for r in results for v in r)
    assert applied == [m.version for m in MIGRATIONS]


def test_sqlite_runs_in_wal_mode(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path}/a.db")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one().lower() == "wal"
