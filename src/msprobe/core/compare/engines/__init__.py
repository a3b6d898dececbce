"""Where compare's rank pairs run. An engine runs one function over many items, each item a pair's
small job, and hands back each outcome as it finishes; compare (rank_pairs.py) knows nothing else of it.

  pool: this host, in forked worker processes (or in this process for a small compare); the default.
  ray:  a Ray cluster's workers, one task per pair (`ray` is imported only in engines/ray.py).

A second engine is one more module with the `Engine` methods and one more line in `open_engine`.
Must not import torch or mindspore.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

ENGINES = ("pool", "ray")


@dataclass
class TaskLost:
    """An item whose task never finished: its worker died more often than the engine retries."""

    message: str


class Engine(Protocol):
    name: str
    slots: int  # items it runs at once
    inline: bool  # runs in this process (progress bars and log lines as they come)
    lean_driver: bool  # pairs keep no suspect evidence in the driver (what is listed is read again)

    def run(self, fn: Callable, shared, items: Iterable) -> Iterator[tuple[int, object]]:
        """(position in `items`, fn(shared, item) or TaskLost) of every item, as each finishes.
        `shared` is sent once per worker (or once to the cluster), not once per item."""

    def close(self) -> None:
        """Let go of what the engine started."""


def open_engine(name="pool", *, address=None, workers=1):
    """The engine `name` ("pool": `workers` processes on this host; "ray": the cluster at `address`,
    RAY_ADDRESS, or a local one started for this compare)."""
    from msprobe.core.errors import ConfigError
    if name == "pool":
        if address is not None:
            raise ConfigError("address", address, "only with engine 'ray'")
        from msprobe.core.compare.engines.pool import PoolEngine
        return PoolEngine(workers)
    if name == "ray":
        from msprobe.core.compare.engines.ray import RayEngine
        return RayEngine(address)
    raise ConfigError("engine", name, ", ".join(ENGINES))
