"""``sweep.md`` and ``sweep.png`` say what their numbers are: an emulated sweep is named emulated, with
its network and its modeled communication, and is not blamed on gloo; the plot's title is whole and its
value labels clear the error bars (measured on the drawn figure, not by eye)."""

from __future__ import annotations

import pytest

from megatron.bridge.perf.harness.results import SteadyState
from megatron.bridge.perf.harness.sweep import SweepPoint, parse_sweep, sweep_figure, sweep_markdown

KEY = "comm_overlap.overlap_moe_expert_parallel_comm"


def _points(emulated: bool, spread: float = 0.4) -> list[SweepPoint]:
    network = "h100_ib400" if emulated else None
    comm = (0.21, 0.20) if emulated else (None, None)
    return [
        SweepPoint(
            "false",
            "runs/a",
            SteadyState(3, 8, 2.0, 2.0 - spread, 2.0 + spread, 6, modeled_comm_s=comm[0], emulated_network=network),
        ),
        SweepPoint(
            "true",
            "runs/b",
            SteadyState(3, 8, 1.9, 1.9 - spread, 1.9 + spread, 6, modeled_comm_s=comm[1], emulated_network=network),
        ),
    ]


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
def test_an_emulated_sweep_says_emulated_names_the_network_and_shows_the_modeled_communication(cpu):
    md = sweep_markdown(parse_sweep(f"{KEY}=false,true"), _points(emulated=True), "cmd", cpu=cpu)
    head = md.split("| ")[0]
    assert "EMULATED" in head and "'h100_ib400'" in head and "modeled" in head, head
    assert "gloo" not in md, md  # no gloo collective ran: the communication was modeled
    assert "modeled comm (s)" in md and "| 0.2100 |" in md and "| 0.2000 |" in md, md


def test_a_measured_cpu_sweep_still_says_why_it_ranks_nothing():
    md = sweep_markdown(parse_sweep(f"{KEY}=false,true"), _points(emulated=False), "cmd", cpu=True)
    assert "gloo" in md and "EMULATED" not in md and "modeled comm" not in md


def _whisker_boxes(ax, dpi: float) -> list:
    """Display boxes of every cap (a marker ``markersize`` points wide, ``markeredgewidth`` thick) and
    every stem of the bars' error bars."""
    from matplotlib.transforms import Bbox

    (bars,) = [c for c in ax.containers if getattr(c, "errorbar", None) is not None]
    _, caps, (stems,) = bars.errorbar.lines
    boxes = []
    for cap in caps:
        half_w = cap.get_markersize() / 2 * dpi / 72
        half_h = max(cap.get_markeredgewidth(), 1.0) / 2 * dpi / 72
        for x, y in cap.get_transform().transform(cap.get_xydata()):
            boxes.append(Bbox([[x - half_w, y - half_h], [x + half_w, y + half_h]]))
    boxes += [path.get_extents(stems.get_transform()) for path in stems.get_paths()]
    return boxes


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


@pytest.mark.parametrize("emulated", [False, True], ids=["measured", "emulated"])
def test_the_plot_title_is_whole_inside_the_image(emulated):
    fig = sweep_figure(parse_sweep(f"{KEY}=false,true"), _points(emulated))
    renderer = _drawn(fig)
    image = fig.bbox
    texts = [fig.axes[0].title, *fig.texts, fig.axes[0].xaxis.label]
    shown = " ".join(t.get_text() for t in texts)
    assert KEY in shown.replace("\n", ""), shown
    for text in texts:
        box = text.get_window_extent(renderer)
        assert image.x0 <= box.x0 and box.x1 <= image.x1 and box.y1 <= image.y1, (text.get_text(), box, image)


@pytest.mark.parametrize("spread", [0.0, 0.05, 0.4, 1.5], ids=["none", "small", "wide", "wider-than-mean"])
def test_value_labels_clear_the_error_bars_and_stay_inside_the_axes(spread):
    fig = sweep_figure(parse_sweep(f"{KEY}=false,true"), _points(False, spread))
    renderer = _drawn(fig)
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().endswith("s")]
    assert len(labels) == 2
    whisker_boxes = _whisker_boxes(ax, fig.dpi)
    assert len(whisker_boxes) == 6  # two caps and a stem per bar
    axes_box = ax.get_window_extent(renderer)
    for label in labels:
        box = label.get_window_extent(renderer)
        assert axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1, (label.get_text(), box, axes_box)
        for whisker in whisker_boxes:
            assert not box.overlaps(whisker), (label.get_text(), box, whisker)
