"""Each ``[[clusters]]`` kind and the class behind the seam for it (docs/clusters.md)."""

from __future__ import annotations

from collections.abc import Mapping

from regen.engine.cluster.base import Cluster
from regen.engine.cluster.slurm import Slurm
from regen.engine.config.settings import ClusterSettings, SGLangSettings


def cluster_of(
    cluster: ClusterSettings, sglang: SGLangSettings, *, env: Mapping[str, str] | None = None
) -> Cluster:
    """The cluster behind the seam for one ``[[clusters]]`` table."""
    if cluster.kind == "slurm":
        return Slurm(cluster, sglang, env=env)
    raise AssertionError(f"no cluster kind {cluster.kind!r}")  # the settings' Literal allows no other


__all__ = ["cluster_of"]
