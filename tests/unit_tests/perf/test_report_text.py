"""The overlap report as the harness prints it: one heading, each fact once, the ``-g cpu`` target
said as CPU smoke mode, and a switch that a warning says does nothing shown as a warning, not as an
active feature."""

from __future__ import annotations

import io

from megatron.bridge.perf.harness.run import main

TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--dryrun"]


def dry_run(tmp_path, *extra: str) -> str:
    out = io.StringIO()
    assert main([*TINY_CPU, "-l", str(tmp_path / "run"), *extra], out=out) == 0, out.getvalue()
    return out.getvalue()


def test_each_report_fact_is_printed_once(tmp_path):
    text = dry_run(tmp_path)
    assert text.lower().count("overlap report") == 1, text
    assert text.count("Transformer Engine absent") <= 1, text


def test_cpu_target_is_named_as_cpu_smoke_mode(tmp_path):
    text = dry_run(tmp_path)
    target = next(line for line in text.splitlines() if "target GPU:" in line)
    assert "CPU smoke mode (-g cpu)" in target and "no GPU type given" not in target, target


def test_a_switch_with_no_effect_reads_as_a_warning_not_as_active(tmp_path):
    text = dry_run(tmp_path, "model.moe_shared_expert_overlap=true")
    active = next(line for line in text.splitlines() if line.strip().startswith("active:"))
    assert "shared_expert_overlap" not in active, active
    assert "WARNING: shared_expert_overlap has no effect" in text and "no shared expert" in text, text
