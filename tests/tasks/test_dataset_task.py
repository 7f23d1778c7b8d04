"""The `dataset` task on real files exported here: formats, column mapping, order, held-out rows, verifiers,
and bad files refused with the file, row and column named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tgc_rl.config import JobSpec, SpecError
from tgc_rl.tasks import load_task
from tgc_rl.tasks.dataset import DataError, DataExhausted, DatasetParams, DatasetTask, read_table, score_row
from tgc_rl.tasks.export import export_rows, write_rows
from tgc_rl.tasks.grants import LOCAL_GRANTS


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("data")
    math_rows = export_rows("arithmetic", {"max_operand": 20, "ops": ["+", "-"]}, 30)
    code_rows = export_rows("code", {}, 8) + export_rows("humaneval", {}, 2)
    return {
        "math.jsonl": write_rows(math_rows, d / "math.jsonl"),
        "math.parquet": write_rows(math_rows, d / "math.parquet"),
        "code.jsonl": write_rows(code_rows, d / "code.jsonl"),
        "code.parquet": write_rows(code_rows, d / "code.parquet"),
        "mixed.jsonl": write_rows(math_rows[:5] + code_rows[:3], d / "mixed.jsonl"),
    }


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["math.jsonl", "math.parquet"])
def test_exported_math_rows_load_and_their_reference_answers_score_one(files, name):
    task = load_task("dataset", {"path": str(files[name])}, seed=0, grants=LOCAL_GRANTS)
    assert len(task) == 30
    for i in range(30):
        item = task.item(i)
        assert item.kind == "dataset" and item.meta["verifier"] == "math"
        assert score_row(item, f"The answer is {item.answer}.", None).reward == 1.0
        assert score_row(item, "I do not know", None).reward == 0.0


@pytest.mark.parametrize("name", ["code.jsonl", "code.parquet"])
def test_exported_code_rows_pass_their_tests_with_the_reference_solution_in_the_sandbox(files, name):
    from tgc_rl.tasks.code_tests import make_sandbox

    references = {r["prompt"]: r for r in export_rows("code", {}, 8)}
    task = DatasetTask(seed=0, path=str(files[name]))
    sandbox = make_sandbox("bwrap")
    checked = 0
    for i in range(len(task)):
        item = task.eval_item(i)
        assert item.meta["verifier"] == "code" and item.meta["tests"]["style"] in ("stdio", "function")
        if item.prompt in references:
            source = load_task("code", {}, 0, LOCAL_GRANTS)
            ref = next(
                source.item(j).meta["reference"] for j in range(8) if source.item(j).prompt == item.prompt
            )
            assert score_row(item, f"```python\n{ref}```", lambda *a: sandbox).reward == 1.0
            assert score_row(item, "```python\nprint('wrong')\n```", lambda *a: sandbox).reward == 0.0
            checked += 1
    assert checked == 8


def test_rows_may_carry_their_own_verifier(files):
    task = DatasetTask(path=str(files["mixed.jsonl"]), shuffle=False)
    assert [task.item(i).meta["verifier"] for i in range(8)] == ["math"] * 5 + ["code"] * 3


def test_csv_and_save_to_disk_directories_load(tmp_path):
    import datasets

    write(tmp_path / "q.csv", "question,gold\nWhat is 2+2?,4\nCapital of France?,Paris\n")
    task = DatasetTask(
        path=str(tmp_path / "q.csv"), prompt_column="question", answer_column="gold", verifier="exact"
    )
    assert [task.eval_item(i).answer for i in range(2)] == ["4", "Paris"]
    assert score_row(task.eval_item(1), "The capital is\nparis.", None).reward == 1.0
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"prompt": "1+1?", "answer": "2"}] * 3),
            "test": datasets.Dataset.from_list([{"prompt": "2+2?", "answer": "4"}]),
        }
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    test = DatasetTask(path=str(tmp_path / "saved"), split="test")
    assert len(test) == 1 and test.eval_item(0).answer == "4"
    with pytest.raises(
        DataError, match=r"holds the splits \['test', 'train'\]; choose one with task.params.split"
    ):
        DatasetTask(path=str(tmp_path / "saved")).rows  # noqa: B018


def test_chat_messages_and_the_system_prompt_reach_the_item(tmp_path):
    rows = [
        {
            "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "3+4?"}],
            "answer": "7",
            "source": "hand",
        }
    ]
    path = write(tmp_path / "chat.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    item = DatasetTask(path=str(path), metadata_columns=["source"]).eval_item(0)
    assert item.prompt == "3+4?" and item.meta["messages"][0] == {"role": "system", "content": "Be terse."}
    assert item.meta["metadata"] == {"source": "hand"}
    plain = write(tmp_path / "plain.jsonl", '{"prompt": "3+4?", "answer": 7}\n')
    item = DatasetTask(path=str(plain), system_prompt="Answer with a number.").eval_item(0)
    assert item.meta["messages"] == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "3+4?"},
    ]
    assert item.answer == "7"  # a number in the answer column is its text


def test_order_is_a_new_permutation_each_epoch_and_the_same_for_the_same_seed(files):
    a, b = (
        DatasetTask(seed=3, path=str(files["math.jsonl"])),
        DatasetTask(seed=3, path=str(files["math.jsonl"])),
    )
    ids = [a.item(i).meta["row"] for i in range(60)]
    assert ids == [b.item(i).meta["row"] for i in range(60)]
    first, second = ids[:30], ids[30:]
    assert sorted(first) == sorted(second) == sorted(str(i) for i in range(1, 31))  # every row once an epoch
    assert first != second
    assert ids != [DatasetTask(seed=4, path=str(files["math.jsonl"])).item(i).meta["row"] for i in range(60)]
    # an item depends on its index only: a fresh task (a resumed job) continues mid-epoch with the same rows
    assert [
        DatasetTask(seed=3, path=str(files["math.jsonl"])).item(i).meta["row"] for i in range(17, 40)
    ] == ids[17:40]


def test_epochs_bound_the_stream(files):
    task = DatasetTask(path=str(files["math.jsonl"]), epochs=2)
    assert task.available(59) and not task.available(60)
    task.item(59)
    with pytest.raises(DataExhausted, match="all 2 epoch"):
        task.item(60)


def test_held_out_rows_are_never_trained_on_and_do_not_depend_on_the_seed(files):
    train = DatasetTask(seed=1, path=str(files["math.jsonl"]), holdout=7)
    held = DatasetTask(seed=1, role="holdout", path=str(files["math.jsonl"]), holdout=7)
    held_other_seed = DatasetTask(seed=9, role="holdout", path=str(files["math.jsonl"]), holdout=7)
    trained = {train.item(i).meta["row"] for i in range(23 * 3)}
    evaluated = {held.eval_item(i).meta["row"] for i in range(len(held))}
    assert len(trained) == 23 and len(evaluated) == 7 and not trained & evaluated
    assert evaluated == {held_other_seed.eval_item(i).meta["row"] for i in range(7)}


def test_long_prompts_are_dropped_and_counted_not_truncated(tmp_path):
    path = write(
        tmp_path / "long.jsonl",
        f'{{"prompt": "short", "answer": "1"}}\n{{"prompt": "{"word " * 500}", "answer": "2"}}\n',
    )
    task = DatasetTask(path=str(path))
    assert task.filter_prompts(lambda item: len(item.prompt) < 100) == 1
    assert len(task) == 1 and task.dropped_too_long == 1 and task.item(0).prompt == "short"


def test_exact_and_regex_verifiers(tmp_path):
    path = write(
        tmp_path / "v.jsonl",
        '{"prompt": "Name it", "answer": "New York", "verifier": "exact"}\n'
        '{"prompt": "Give a date", "answer": "\\\\d{4}-\\\\d{2}-\\\\d{2}", '
        '"verifier": "regex"}\n',
    )
    task = DatasetTask(path=str(path), shuffle=False)
    exact, regex = task.item(0), task.item(1)
    assert score_row(exact, "It is <answer> new  york </answer>", None).reward == 1.0
    assert score_row(exact, "New York City", None).reward == 0.0
    assert score_row(regex, "on 2024-05-01 I think", None).reward == 1.0
    assert score_row(regex, "sometime in May", None).reward == 0.0


# -- bad files: refused with file, row and column named -------------------------------------------
def _refused(tmp_path: Path, name: str, text: str | bytes, **params) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError) as e:
        DatasetTask(path=str(path), **params).rows  # noqa: B018
    assert str(path) in str(e.value)
    return str(e.value)


def test_a_missing_column_is_named_with_the_columns_the_file_has(tmp_path):
    msg = _refused(tmp_path, "a.jsonl", '{"question": "1+1?", "answer": "2"}\n')
    assert "no column 'prompt'" in msg and "['question', 'answer']" in msg and "prompt_column" in msg
    msg = _refused(tmp_path, "b.jsonl", '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?"}\n')
    assert "row 2, column 'answer': missing" in msg
    msg = _refused(tmp_path, "c.jsonl", '{"prompt": "f?", "verifier": "code"}\n')
    assert "row 1, column 'tests': missing or not an object" in msg


def test_a_wrong_type_is_named_with_row_and_column(tmp_path):
    msg = _refused(
        tmp_path, "a.jsonl", '{"prompt": "1+1?", "answer": "2"}\n{"prompt": ["x"], "answer": "3"}\n'
    )
    assert "row 2, column 'prompt'" in msg and "list" in msg
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [True, False]}), tmp_path / "b.parquet")
    with pytest.raises(
        DataError, match=r"b.parquet: row 1, column 'answer': a bool, but the reference answer must be text"
    ):
        DatasetTask(path=str(tmp_path / "b.parquet")).rows  # noqa: B018
    msg = _refused(tmp_path, "c.jsonl", '{"prompt": "a", "answer": "1", "verifier": "maths"}\n')
    assert "row 1, column 'verifier': 'maths' is not a verifier" in msg
    msg = _refused(tmp_path, "d.jsonl", '{"prompt": "a", "answer": "(", "verifier": "regex"}\n')
    assert "row 1, column 'answer': not a valid regular expression" in msg
    msg = _refused(tmp_path, "e.jsonl", '{"prompt": "a", "verifier": "code", "tests": {"style": "stdio"}}\n')
    assert "row 1, column 'tests'" in msg and "at least one" in msg


def test_broken_json_lines_are_named_by_row(tmp_path):
    msg = _refused(tmp_path, "a.jsonl", '{"prompt": "a", "answer": "1"}\n{"prompt": "b", answer: 2}\n')
    assert "row 2: not valid JSON" in msg
    msg = _refused(tmp_path, "b.jsonl", '{"prompt": "a", "answer": "1"}\n["prompt", "b"]\n')
    assert "row 2: a JSON list, not an object" in msg
    msg = _refused(tmp_path, "c.jsonl", '{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": "x"}\n')
    assert "row 2, column 'answer': a string, but row 1 has a number" in msg


def test_empty_files_are_refused(tmp_path):
    assert "the file is empty" in _refused(tmp_path, "a.jsonl", "")
    assert "no rows" in _refused(tmp_path, "b.jsonl", "\n\n")
    assert "no rows (a header alone)" in _refused(tmp_path, "c.csv", "prompt,answer\n")


def test_a_one_gigabyte_line_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as fh:  # sparse: 1 GiB on paper, nothing on disk
        fh.write(b'{"prompt": "a", "answer": "1"}\n{"prompt": "')
        fh.truncate(1 << 30)
    with pytest.raises(DataError, match=r"huge.jsonl: row 2: longer than 64 MiB"):
        DatasetTask(path=str(path)).rows  # noqa: B018


def test_unknown_suffixes_and_missing_files_say_what_to_do(tmp_path):
    assert "name the file .jsonl, .parquet or .csv" in _refused(tmp_path, "data.txt", "hello\n")
    with pytest.raises(DataError, match="no such file"):
        read_table(DatasetParams(path=str(tmp_path / "absent.jsonl")))


def test_a_hub_id_without_a_reachable_hub_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match="the Hugging Face hub is not reachable from this worker"):
        read_table(DatasetParams(hub_id="openai/gsm8k"))


def test_file_paths_stay_inside_the_data_root(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    write(root / "ok.jsonl", '{"prompt": "a", "answer": "1"}\n')
    (root / "escape.jsonl").symlink_to(tmp_path / "outside.jsonl")
    write(tmp_path / "outside.jsonl", '{"prompt": "secret", "answer": "1"}\n')
    monkeypatch.setenv("TGC_DATA_ROOT", str(root))
    assert len(DatasetTask(file="ok.jsonl")) == 1
    with pytest.raises(DataError, match="resolves outside the data root"):
        DatasetTask(file="escape.jsonl").rows  # noqa: B018
    with pytest.raises(SpecError, match="relative path inside the data root"):
        JobSpec.parse({"task": {"name": "dataset", "params": {"file": "../outside.jsonl"}}})
    monkeypatch.delenv("TGC_DATA_ROOT")
    with pytest.raises(DataError, match="this server has no data root"):
        DatasetTask(file="ok.jsonl").rows  # noqa: B018


def test_the_spec_names_bad_dataset_params_and_privileged_paths():
    with pytest.raises(SpecError, match="give exactly one of path, file, dataset_id, hub_id"):
        JobSpec.parse({"task": {"name": "dataset", "params": {}}})
    with pytest.raises(SpecError, match=r"task.params.verifier"):
        JobSpec.parse(
            {"task": {"name": "dataset", "params": {"dataset_id": "ds_" + "0" * 32, "verifier": "x"}}}
        )
    spec = JobSpec.parse(
        {
            "task": {"name": "dataset", "params": {"path": "/data/train.jsonl", "holdout": 4}},
            "eval": {"dataset": {"path": "/data/test.jsonl"}},
        }
    )
    assert spec.privileges() == {"task.params.path": "host_paths", "eval.dataset.path": "host_paths"}
    ok = JobSpec.parse(
        {"task": {"name": "dataset", "params": {"dataset_id": "ds_" + "a" * 32, "holdout": 4}}, "eval": {}}
    )
    assert ok.privileges() == {}
    with pytest.raises(SpecError, match="eval.dataset: name the evaluation rows"):
        JobSpec.parse({"eval": {}})
    with pytest.raises(SpecError, match="samples_per_prompt > 1 needs greedy: false"):
        JobSpec.parse(
            {
                "task": {"name": "dataset", "params": {"dataset_id": "ds_" + "a" * 32, "holdout": 4}},
                "eval": {"samples_per_prompt": 4},
            }
        )
    with pytest.raises(SpecError, match="also_greedy needs greedy: false"):
        JobSpec.parse(
            {
                "task": {"name": "dataset", "params": {"dataset_id": "ds_" + "a" * 32, "holdout": 4}},
                "eval": {"also_greedy": True},
            }
        )
