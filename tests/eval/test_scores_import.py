"""Real-robot score files -> results table + rollouts table."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from demoscale import DEFAULT_CONFIDENCE
from demoscale.eval.cli import main as eval_main
from demoscale.eval.rollout import mean_interval, wilson_interval
from demoscale.eval.scores import RESULT_COLUMNS, ScoreFileError, import_scores

STAGED = """run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,stage_1,stage_2,stage_3,success
envs4,4,1,50,kitchen,mug,1,1,1,1
envs4,4,1,50,lab,mug,1,0,0,0
envs4,4,1,50,office,mug,1,1,0,no
envs16,16,1,50,kitchen,mug,1,1,1,yes
"""


def test_import_round_trip(tmp_path) -> None:
    source = tmp_path / "scores.csv"
    source.write_text(STAGED)
    results, rollouts = import_scores(source, tmp_path / "out")
    assert list(results.columns[: len(RESULT_COLUMNS)]) == RESULT_COLUMNS
    on_disk = pd.read_csv(tmp_path / "out" / "results.csv", dtype={"trial_id": str})
    assert list(on_disk["trial_id"]) == ["envs4", "envs16"]
    row = on_disk.iloc[0]
    assert row["n_rollouts"] == 3 and row["success_rate"] == pytest.approx(1 / 3)
    assert row["score"] == pytest.approx((3 + 1 + 2) / 9)
    assert (row["success_ci_low"], row["success_ci_high"]) == pytest.approx(wilson_interval(1, 3))
    assert row["confidence"] == DEFAULT_CONFIDENCE
    assert (row["score_ci_low"], row["score_ci_high"]) == pytest.approx(mean_interval([1, 1 / 3, 2 / 3]))
    # The run at 16 environments scored 1 on its only rollout: an interval, not the point [1, 1].
    assert on_disk.iloc[1]["score_ci_low"] < 1.0 == on_disk.iloc[1]["score_ci_high"]
    assert row["n_pairs"] == 4 and row["total_demos"] == 200
    assert json.loads(row["env_ids"]) == ["kitchen", "lab", "office"]
    back = pd.read_csv(tmp_path / "out" / "rollouts.csv")
    assert len(back) == 4 and list(back["rollout_index"]) == [0, 1, 2, 0]
    assert list(back["success"]) == [True, False, False, True]
    assert back["stage_2"].tolist() == [1, 0, 1, 1]


def test_raw_points_need_max_score_and_success_defaults_to_full_score(tmp_path) -> None:
    source = tmp_path / "points.csv"
    source.write_text("run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,score\nr,1,1,10,e,o,2\n")
    with pytest.raises(ScoreFileError, match="add a 'max_score' column"):
        import_scores(source)
    source.write_text("run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,score,max_score\n"
                      "r,1,1,10,e,o,2,3\nr,1,1,10,e,o,3,3\n")  # fmt: skip
    results, rollouts = import_scores(source)
    assert rollouts["score"].tolist() == pytest.approx([2 / 3, 1.0])
    assert rollouts["success"].tolist() == [False, True]


def test_bad_score_files_name_the_problem(tmp_path, capsys) -> None:
    source = tmp_path / "bad.csv"
    source.write_text("run_id,n_envs,env_id,object_id,score\nr,1,e,o,1\n")
    with pytest.raises(
        ScoreFileError, match=r"missing required column\(s\) \['n_objects', 'demos_per_pair'\]"
    ):
        import_scores(source)
    source.write_text(
        "run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,score,success\nr,1,1,5,e,o,1,maybe\n"
    )
    with pytest.raises(ScoreFileError, match="column 'success', row 2"):
        import_scores(source)
    source.write_text(
        "run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,score\nr,1,1,5,e,o,1\nr,2,1,5,e,o,1\n"
    )
    with pytest.raises(ScoreFileError, match="several values of 'n_envs'"):
        import_scores(source)
    assert eval_main(["import-scores", str(source), "--out", str(tmp_path / "o")]) == 2
    assert "n_envs" in capsys.readouterr().err


def test_import_scores_cli_takes_the_confidence_level(tmp_path, capsys) -> None:
    source = tmp_path / "scores.csv"
    source.write_text(STAGED)
    out = tmp_path / "out"
    assert eval_main(["import-scores", str(source), "--out", str(out), "--confidence", "0.95"]) == 0
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert row["confidence"] == 0.95
    assert (row["success_ci_low"], row["success_ci_high"]) == pytest.approx(wilson_interval(1, 3, 0.95))


HEADER = "run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,score\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (HEADER + "r,-2,1,10,e,o,1\n", r"column 'n_envs', row 2: '-2' is below 1"),
        (HEADER + "r,0,1,10,e,o,1\n", r"column 'n_envs', row 2: '0' is below 1"),
        (HEADER + "r,2.5,1,10,e,o,1\n", r"column 'n_envs', row 2: '2.5' is not a whole number"),
        (HEADER + "r,inf,1,10,e,o,1\n", r"column 'n_envs', row 2: 'inf' is not a finite number"),
        (HEADER + "r,1,nan,10,e,o,1\n", r"column 'n_objects', row 2: 'nan' is not a number"),
        (HEADER + "r,1,1,inf,e,o,1\n", r"column 'demos_per_pair', row 2: 'inf' is not a finite number"),
        (HEADER + "r,1,1,0,e,o,1\n", r"column 'demos_per_pair', row 2: must be positive"),
        (HEADER + "r,1,1,10,e,o,inf\n", r"column 'score', row 2: 'inf' is not a finite number"),
        (HEADER.replace("\n", ",seed\n") + "r,1,1,10,e,o,1,1e400\n", r"column 'seed', row 2"),
        (HEADER.replace("\n", ",n_pairs\n") + "r,1,1,10,e,o,1,inf\n", r"column 'n_pairs', row 2"),
        (HEADER + "r,1,1,10,,o,1\n", r"column 'env_id', row 2: empty"),
        ("", r"empty file"),
    ],
    ids=["negative", "zero", "fractional", "inf", "nan", "inf-demos", "zero-demos", "inf-score", "huge-seed",
         "inf-pairs", "empty-id", "empty-file"],
)  # fmt: skip
def test_bad_numbers_and_empty_files_are_messages(tmp_path, capsys, content, message) -> None:
    source = tmp_path / "scores.csv"
    source.write_text(content)
    with pytest.raises(ScoreFileError, match=message):
        import_scores(source)
    assert eval_main(["import-scores", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "Traceback" not in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_random_bytes_are_a_message(tmp_path, capsys) -> None:
    source = tmp_path / "scores.csv"
    source.write_bytes(bytes(range(256)) * 8)
    assert eval_main(["import-scores", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "not a CSV text file" in capsys.readouterr().err


def test_formula_cells_are_escaped_in_the_written_tables(tmp_path) -> None:
    source = tmp_path / "scores.csv"
    source.write_text(
        "run_id,n_envs,n_objects,demos_per_pair,env_id,object_id,score,policy,checkpoint\n"
        '"=HYPERLINK(""http://x"")",1,1,10,+cmd,@SUM(A1),0.5,-1+1,-2.5\n'
    )
    import_scores(source, tmp_path / "out")
    results = (tmp_path / "out" / "results.csv").read_text()
    rollouts = (tmp_path / "out" / "rollouts.csv").read_text()
    assert "'=HYPERLINK" in results and "'-1+1" in results and ",-2.5" in results  # a number stays a number
    assert "'+cmd" in rollouts and "'@SUM(A1)" in rollouts
    for text in (results, rollouts):
        cells = [cell for line in text.splitlines()[1:] for cell in line.split(",")]
        assert not [
            cell for cell in cells if cell and (cell[0] in "=+@" or (cell[0] == "-" and cell != "-2.5"))
        ]
