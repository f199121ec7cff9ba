"""Which perf cases run: the batch sizes and graph-mode variants a card's perf
tests are parametrized over, and why a card has no case on a platform."""

from __future__ import annotations

from typing import NamedTuple

from npu_conformance.cards import Card


def perf_batch_sizes(card: Card) -> list[int | None]:
    """The batch sizes a card's perf tests are parametrized over: those of every
    platform, so collection needs no platform detection (a test skips the ones its
    platform does not set); [None] for a card without any perf settings."""
    sizes = {b for s in card.platforms.values() if s.perf for b in s.perf.batch_sizes}
    return sorted(sizes) or [None]


def perf_cards(card: Card) -> list[Card]:
    """The card, and its graph-mode variant where any platform's perf measures one."""
    graph = any(s.perf and s.perf.graph for s in card.platforms.values())
    return [card, card.variant("graph")] if graph else [card]


class NoCase(NamedTuple):
    """Why a card has no perf case here; `gap`: the card leaves its speed ungated
    on the platform without saying why (a strict run fails on it), as opposed to
    an exemption or a batch size or mode only another platform measures."""

    reason: str
    gap: bool


def skip_reason(card: Card, platform: str, batch_size: int | None = None) -> NoCase | None:
    """Why `card` has no perf case (at `batch_size`) on `platform`, or None."""
    settings = card.platform(platform)
    spec = settings.perf
    if spec is None:
        if settings.perf_exempt:
            return NoCase(f"{card.name} is exempt from the perf gate on {platform}: {settings.perf_exempt}", False)
        return NoCase(f"{card.name} has no perf settings for platform {platform} (give platforms.{platform}.perf, "
                      f"or perf: null with perf_exempt: <why>)", True)
    if card.condition is not None and not spec.graph:
        return NoCase(f"{card.base_name}'s {platform} perf settings do not measure graph mode (perf.graph)", False)
    if batch_size is not None and batch_size not in spec.batch_sizes:
        return NoCase(f"batch size {batch_size} is not in {card.name}'s {platform} perf batch_sizes "
                      f"{list(spec.batch_sizes)}", False)
    return None
