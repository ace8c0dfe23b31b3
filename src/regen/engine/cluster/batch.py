"""The batch script of a cluster job: one step per node, each running the node script (docs/clusters.md).

One step per node, not one step of N tasks, so that a node's step ends alone (its server died, the
node was lost) while the others go on: ``--kill-on-bad-exit=0`` and ``wait`` keep the job until the
last step ends. The script holds no secret and no shell string made of settings: every value is
quoted with ``shlex.quote``, the node script's bootstrap is fixed (engine/host/remote.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from regen.engine.config.settings import ClusterSettings
from regen.engine.host.remote import FILE_BOOTSTRAP, interpreter_words

STEP_NAME = "regen-node"


def job_name(cluster: ClusterSettings) -> str:
    return f"regen-{cluster.name}"


def sbatch_lines(cluster: ClusterSettings, folder: Path) -> list[str]:
    """The ``#SBATCH`` header: what the job asks of the cluster."""
    options = [f"--job-name={job_name(cluster)}", *asked_of(cluster)]
    options += [f"--output={folder / 'batch.log'}", "--open-mode=append"]
    return [f"#SBATCH {option}" for option in options]


def asked_of(cluster: ClusterSettings) -> list[str]:
    """What the job asks of the cluster, as sbatch options (said beside a refusal)."""
    options = [f"--nodes={cluster.nodes}", "--ntasks-per-node=1", f"--time={cluster.time_limit}"]
    if cluster.partition:
        options.append(f"--partition={cluster.partition}")
    if cluster.gpus_per_node:
        options.append(f"--gres=gpu:{cluster.gpus_per_node}")
    if cluster.account:
        options.append(f"--account={cluster.account}")
    if cluster.qos:
        options.append(f"--qos={cluster.qos}")
    options.extend(cluster.sbatch_args)
    return options


def batch_script(cluster: ClusterSettings, folder: Path) -> str:
    """The whole script: with sbatch its header is read; run by regen inside an allocation it is not."""
    python = " ".join(shlex.quote(w) for w in interpreter_words(cluster.python))
    gres = f" --gres=gpu:{cluster.gpus_per_node}" if cluster.gpus_per_node else ""
    q = shlex.quote
    return "\n".join(
        [
            "#!/bin/bash",
            *sbatch_lines(cluster, folder),
            f"# regen's SGLang servers on cluster {cluster.name}, one per node (docs/clusters.md). Written by",
            "# regen sglang start; regen sglang stop ends it.",
            "set -u",
            f"folder={q(str(folder))}",
            f"boot={q(FILE_BOOTSTRAP)}",
            # Inside an allocation regen names the nodes it may use; under sbatch the job's own list.
            f'nodes=$(scontrol show hostnames "${{REGEN_NODELIST:-$SLURM_JOB_NODELIST}}" | head -n {cluster.nodes})',
            "for node in $nodes; do",
            f'  srun --nodes=1 --ntasks=1 --nodelist="$node" --job-name={STEP_NAME}{gres} --kill-on-bad-exit=0 \\',
            f'    --output="$folder/nodes/$node.out" {python} -c "$boot" "$folder/node.payload" &',
            "done",
            "wait",
            "",
        ]
    )


__all__ = ["STEP_NAME", "asked_of", "batch_script", "job_name", "sbatch_lines"]
