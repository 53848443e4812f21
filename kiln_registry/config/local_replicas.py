"""The placement rules of a local profile's replicas (``[teachers.local.<profile>]``).

``replicas = N`` (1..``MAX_LOCAL_REPLICAS``) launches N vLLM processes of one
prepared snapshot: one per loopback port (``ports``, N distinct; ``port``
alone for N = 1) and, optionally, one per GPU (``devices``, N distinct
``cuda:<index>``; each process gets ``CUDA_VISIBLE_DEVICES=<index>``).  The
refusals are ``ValueError`` (pydantic turns them into ``ConfigError``s naming
the profile).  Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

MAX_LOCAL_REPLICAS: Final = 8
CUDA_DEVICE_RE: Final = re.compile(r"cuda:(?:0|[1-9][0-9]{0,3})")


def check_replica_placement(
    replicas: int, port: int | None, ports: Sequence[int], devices: Sequence[str]
) -> None:
    """Refuse ports or devices that do not give each of ``replicas`` its own place."""
    if ports and port is not None:
        raise ValueError(
            "give port (one replica) or ports (one per replica), not both; with"
            " replicas > 1 list every replica's port in ports"
        )
    if not ports and port is None:
        raise ValueError("port is required (or ports, one per replica)")
    if replicas > 1 and not ports:
        raise ValueError(f"replicas = {replicas} needs ports = [...] with {replicas} ports")
    if ports and len(ports) != replicas:
        raise ValueError(
            f"ports lists {len(ports)} port(s) but replicas = {replicas}: give one port per replica"
        )
    if len(set(ports)) != len(ports):
        raise ValueError("ports must not repeat a port: every replica listens on its own port")
    if devices and len(devices) != replicas:
        raise ValueError(
            f"devices lists {len(devices)} device(s) but replicas = {replicas}: give one"
            " device per replica, or omit devices"
        )
    if len(set(devices)) != len(devices):
        raise ValueError("devices must not repeat a device: every replica gets its own GPU")


def device_index(device: str) -> int:
    """The index of a ``cuda:<index>`` device."""
    return int(device.split(":", 1)[1])
