"""GPU fleets from a cluster manager: one SGLang server per node, the nodes given by the cluster.

The seam (base.py) is what the rest of regen sees of a cluster: submit, watch, endpoints, cancel.
Slurm (slurm.py) is behind it today; docs/clusters.md says how SkyPilot and Kubernetes go behind it.
"""
