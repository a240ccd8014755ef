"""Drawing PNGs with matplotlib, an optional package (the ``plots`` extra): a run's loss curve and a
sweep's bar chart. Without it nothing is drawn and the caller says so in one line
(:data:`MISSING`); the results themselves never depend on it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from megatron.bridge.utils.owned_files import replace_file

MISSING = "matplotlib is not installed (uv sync --extra plots)"


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` drawing off-screen, or ``None`` when matplotlib is not installed."""
    try:
        # Deferred: matplotlib is optional and takes a second to import.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def fit_width(fig: Any, texts: list[Any], margin_in: float = 0.15) -> None:
    """Widen ``fig`` until every text in ``texts`` (titles, labels) lies inside it, then lay it out
    again: a long dotted key in a title is shown whole instead of cut at the image's edge."""
    fig.tight_layout()
    for _ in range(4):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [text.get_window_extent(renderer) for text in texts]
        margin = margin_in * fig.dpi
        overflow = max(max(margin - box.x0, box.x1 + margin - fig.bbox.x1, 0.0) for box in boxes)
        if overflow <= 0:
            return
        fig.set_figwidth(fig.get_figwidth() + 2 * overflow / fig.dpi)
        fig.tight_layout()


def save_png(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (replacing a file or link there, never writing through it)."""
    plt = pyplot()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    if plt is not None:
        plt.close(fig)
    replace_file(path, image.getvalue())
    return Path(path)
