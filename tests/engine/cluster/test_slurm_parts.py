"""The Slurm side's parts without a Slurm: the batch script, what sbatch and scontrol print, the
settings' checks, and a node's state from its file and the queue (engine/cluster/)."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from regen.engine.cluster.batch import batch_script, sbatch_lines
from regen.engine.cluster.slurm import Slurm, parse_job_id, parse_scontrol
from regen.engine.config.settings import ClusterSettings, Settings, SGLangSettings
from regen.engine.host.remote import FILE_BOOTSTRAP


def table(**fields: Any) -> ClusterSettings:
    return ClusterSettings(
        **{"name": "lab", "model_path": "/shared/models/K", "work_dir": Path("/shared/regen"), **fields}
    )


def test_the_batch_header_asks_for_what_the_table_says_and_nothing_else() -> None:
    lines = sbatch_lines(
        table(partition="gpu", nodes=4, account="drafters", qos="high", sbatch_args=["--exclusive"]),
        Path("/shared/regen/lab/job-1"),
    )
    assert lines == [
        "#SBATCH --job-name=regen-lab",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --account=drafters",
        "#SBATCH --qos=high",
        "#SBATCH --exclusive",
        "#SBATCH --output=/shared/regen/lab/job-1/batch.log",
        "#SBATCH --open-mode=append",
    ]
    assert not any("--gres" in line for line in sbatch_lines(table(gpus_per_node=0), Path("/f")))


def test_the_script_quotes_every_value_and_runs_one_step_per_node(tmp_path: Path) -> None:
    odd = tmp_path / "a;b$(touch pwned)'"
    script = batch_script(table(python="'/opt/py env/bin/python' -X utf8"), odd)
    assert f"folder={shlex.quote(str(odd))}" in script
    assert f"boot={shlex.quote(FILE_BOOTSTRAP)}" in script
    assert '\'/opt/py env/bin/python\' -X utf8 -c "$boot" "$folder/node.payload" &' in script
    assert '--nodelist="$node" --job-name=regen-node --gres=gpu:8 --kill-on-bad-exit=0' in script
    # The script is valid bash, and the odd name stays a name.
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    assert not (tmp_path / "pwned").exists()


def test_what_sbatch_and_scontrol_print_is_read() -> None:
    assert parse_job_id("1234\n") == "1234"
    assert parse_job_id("1234;lab\n") == "1234"
    with pytest.raises(ValueError, match="not a job id"):
        parse_job_id("sbatch: warning: something\n")
    fields = parse_scontrol("JobId=7 JobName=regen-lab JobState=CANCELLED Reason=None ExitCode=0:15")
    assert fields["JobState"] == "CANCELLED" and fields["Reason"] == "None"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"time_limit": "tomorrow"}, "'tomorrow' is not a Slurm time"),
        ({"sbatch_args": ["exclusive"]}, "'exclusive' is not one sbatch option"),
        ({"sbatch_args": ["--x\n#SBATCH --y"]}, "is not one sbatch option"),
        ({"allocation": "12a"}, "String should match pattern"),
        ({"name": "a b"}, "String should match pattern"),
        ({"work_dir": "/shared/my runs"}, "holds a space or a line break"),
    ],
)
def test_a_bad_table_is_refused_naming_the_value(fields: dict[str, Any], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        table(**fields)


def test_the_tables_must_fit_and_have_names_of_their_own() -> None:
    base = {"name": "lab", "model_path": "/m", "work_dir": "/w"}
    with pytest.raises(ValidationError, match=r"sglang\.tp is 8 but gpus_per_node is 4"):
        Settings(sglang={"tp": 8}, clusters=[{**base, "gpus_per_node": 4}])
    with pytest.raises(ValidationError, match="cluster name 'lab' is used by more than one"):
        Settings(clusters=[base, base])
    with pytest.raises(
        ValidationError, match="'lab' names both a \\[\\[hosts\\]\\] and a \\[\\[clusters\\]\\]"
    ):
        Settings(hosts=[{"name": "lab", "address": "h", "data_root": "/d"}], clusters=[base])
    assert Settings(sglang={"tp": 8}, clusters=[{**base, "gpus_per_node": 0}]).clusters[0].gpus_per_node == 0


def node(rec: dict[str, Any], *, stepping: bool, job: str = "RUNNING", age_s: float = 1.0) -> Any:
    slurm = Slurm(table(), SGLangSettings(), env={})
    now = time.time()
    return slurm._node(
        "node1", {"updated_at": now - age_s, "started_at": now - 10, **rec}, stepping, job, now
    )


def test_a_node_is_lost_when_its_step_is_gone_or_its_heartbeat_stopped() -> None:
    ready = {"state": "ready", "url": "http://10.0.0.1:30000", "ready_at": time.time() - 4}
    assert node(ready, stepping=True).state == "ready"
    assert node(ready, stepping=True).ready_after_s == pytest.approx(6, abs=0.1)
    gone = node(ready, stepping=False)
    assert gone.state == "lost" and "its step ended without a word" in gone.failure
    silent = node(ready, stepping=True, age_s=45)
    assert silent.state == "lost" and "no word from the node for 45 s" in silent.failure
    ended = node({"state": "starting"}, stepping=False, job="TIMEOUT")
    assert ended.state == "lost" and ended.failure == "the job is TIMEOUT"
    # What the node said of itself stands: a failure or a stop is not a loss.
    failed = node({"state": "failed", "failure": "launch failed after weights: OOM"}, stepping=False)
    assert (failed.state, failed.failure) == ("failed", "launch failed after weights: OOM")
