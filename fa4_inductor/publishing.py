"""Where the backend sends the records of each compiled graph: the "fa4_inductor" logger and every
`collecting()` block open at the time (what `explain` and the tests read)."""

from __future__ import annotations

import contextlib
import logging

from fa4_inductor.lowering import Record

log = logging.getLogger("fa4_inductor")
_collectors: list[list] = []


def publish(records: list[Record]) -> None:
    """Called by the backend for every compiled graph."""
    for record in records:
        log.info("%s", record)
    for collector in _collectors:
        collector.extend(records)


@contextlib.contextmanager
def collecting():
    """Gathers the records of every graph compiled inside the block."""
    records: list[Record] = []
    _collectors.append(records)
    try:
        yield records
    finally:
        _collectors.remove(records)
