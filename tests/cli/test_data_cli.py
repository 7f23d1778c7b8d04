"""`tgc data export` writes files the dataset task reads back; `tgc eval` refuses a spec without `eval`."""

import pytest

from tgc_rl.cli import main
from tgc_rl.tasks.dataset import DatasetTask


def test_data_export_writes_jsonl_and_parquet_that_load_back(tmp_path, capsys):
    for name in ("gsm.jsonl", "gsm.parquet"):
        out = tmp_path / name
        assert (
            main(["data", "export", "--task", "reasoning_gym:gsm_symbolic", "--rows", "5", "--out", str(out)])
            == 0
        )
        assert "5 rows of reasoning_gym:gsm_symbolic" in capsys.readouterr().out
        task = DatasetTask(path=str(out))
        assert len(task) == 5 and all(task.eval_item(i).meta["verifier"] == "math" for i in range(5))


def test_data_export_refuses_bad_input_with_exit_code_2(tmp_path, capsys):
    assert main(["data", "export", "--task", "nope", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "unknown task" in capsys.readouterr().err
    assert main(["data", "export", "--task", "arithmetic", "--out", str(tmp_path / "x.txt")]) == 2
    assert "use a .jsonl or .parquet file name" in capsys.readouterr().err
    assert (
        main(
            ["data", "export", "--task", "arithmetic", "--params", "{bad", "--out", str(tmp_path / "x.jsonl")]
        )
        == 2
    )


def test_eval_needs_an_eval_section(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ntask: {name: arithmetic}\n")
    assert main(["eval", str(spec)]) == 2
    assert "add an `eval` section" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--checkpoint", "--run-dir"])
def test_eval_remote_refuses_the_local_only_flags_before_it_submits(tmp_path, capsys, monkeypatch, flag):
    import tgc_rl.cli as cli

    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: x\neval: {{dataset: {{path: {tmp_path / 'rows.jsonl'}}}}}\n")

    def no_server(args):
        raise AssertionError("must refuse before it contacts the server")

    monkeypatch.setattr(cli, "rest_client", no_server)
    assert main(["eval", str(spec), "--remote", flag, str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert flag in err and "local evaluation only" in err and "model.source" in err
