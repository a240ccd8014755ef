"""Which dispatch/combine exchanges of a profiled step stay exposed, by their place in megatron-core's
EP-overlap schedule.

With ``comm_overlap.overlap_moe_expert_parallel_comm`` megatron-core runs the forward of one
micro-batch beside the backward of the previous one, layer by layer
(``TransformerLayerSchedulePlan.run``): on the communication stream the combine's backward, the
dispatch's forward, the dispatch's backward and the combine's forward; beside them, on the compute
stream, attention's forward, the MLP's backward and forward, attention's backward. The first
micro-batch's forward and the last one's backward have no partner.

:func:`exchange_exposure` takes each profiled step's exchanges in the order they started and splits
their time, and the part that no compute kernel on another stream covered, into the unpaired first
forward, the unpaired last backward, and the four places of a paired layer. It needs one kernel per
exchange, as the emulated world's NVSHMEM exchange issues them; the real transport makes one call per
peer and megatron-core's alltoall dispatcher more than one collective, which the count check refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megatron.bridge.perf.analysis.overlap_analysis import ComputeBeside, Event, _events, load_trace

PAIRED_ORDER = ("combine_backward", "dispatch_forward", "dispatch_backward", "combine_forward")
"""The exchanges of one paired layer, in the order megatron-core's schedule issues them."""


class ExchangeCountMismatch(ValueError):
    """The trace's exchanges do not map one kernel to one exchange of the schedule."""


def _exposed(exchange: Event, beside: ComputeBeside) -> float:
    """Microseconds of ``exchange`` that no compute kernel on another stream covers."""
    return (exchange.end - exchange.start) - beside.covered(exchange.stream, exchange.start, exchange.end)


def _add(into: dict[str, float], duration: float, exposed: float) -> None:
    into["ms"] = into.get("ms", 0.0) + duration / 1e3
    into["exposed_ms"] = into.get("exposed_ms", 0.0) + exposed / 1e3


def exchange_exposure(trace: dict[str, Any] | str | Path, layers: int, micro_batches: int) -> dict[str, Any]:
    """Per profiled step, in milliseconds: ``first_forward``, ``last_backward`` and ``paired`` (by
    :data:`PAIRED_ORDER`), each ``{"ms", "exposed_ms"}``. Raises :class:`ExchangeCountMismatch` when
    a step does not hold ``4 x layers x micro_batches`` exchange kernels."""
    if not isinstance(trace, dict):
        trace = load_trace(trace)
    events, steps = _events(trace, include_sendrecv=True, include_cpu_ops=False)
    beside = ComputeBeside(events)
    unpaired, expected = 2 * layers, 4 * layers * micro_batches
    split: dict[str, Any] = {"first_forward": {}, "last_backward": {}, "paired": {name: {} for name in PAIRED_ORDER}}
    spans: dict[int, tuple[float, float]] = {}  # a step's CPU span and its GPU streams' spans, as one
    for number, start, end in steps:
        first, last = spans.get(number, (start, end))
        spans[number] = (min(first, start), max(last, end))
    for start, end in spans.values():
        exchanges = sorted((e for e in events if e.kind == "a2a" and start <= e.start < end), key=lambda e: e.start)
        if len(exchanges) != expected:
            raise ExchangeCountMismatch(
                f"a profiled step holds {len(exchanges)} dispatch/combine kernels, not 4 x {layers} layers x "
                f"{micro_batches} micro-batches = {expected}: the dispatcher issues more than one kernel per "
                "exchange, or the run's layers and micro-batches differ"
            )
        for index, exchange in enumerate(exchanges):
            place = "first_forward" if index < unpaired else "last_backward" if index >= expected - unpaired else None
            target = split[place] if place else split["paired"][PAIRED_ORDER[(index - unpaired) % 4]]
            _add(target, exchange.end - exchange.start, _exposed(exchange, beside))
    return _per_step(split, max(1, len(spans)))


def _per_step(split: dict[str, Any], count: int) -> dict[str, Any]:
    def scaled(tally: dict[str, float]) -> dict[str, float]:
        return {key: round(value / count, 3) for key, value in tally.items()}

    return {
        "first_forward": scaled(split["first_forward"]),
        "last_backward": scaled(split["last_backward"]),
        "paired": {name: scaled(tally) for name, tally in split["paired"].items()},
    }


__all__ = ["PAIRED_ORDER", "ExchangeCountMismatch", "exchange_exposure"]
