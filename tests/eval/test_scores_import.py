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
