"""The layer-spec benchmark's plan, its cases as the harness validates them, and its result rows and
page, from synthetic run summaries (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from perf_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("layer_specs_benchmark.py")


def _summary(step_s: float, layer_spec: str) -> dict:
    return {
        "steady_state_mean_s": step_s,
        "steady_state_min_s": 0.9 * step_s,
        "steady_state_max_s": 1.1 * step_s,
        "tflops_per_gpu": 100.0 / step_s,
        "peak_memory_gib": 30.0,
        "layer_spec": layer_spec,
        "gradient_accumulation_fusion": {"enabled": False, "description": None},
        "extra": {"gpu_fwd_bwd_s": [0.8 * step_s] * 12, "gpu_optimizer_s": [0.1] * 12, "host_fwd_bwd_s": [0.5] * 12},
    }


def test_cases_are_interleaved_and_the_profiled_runs_come_last(bench, tmp_path):
    args = bench.parse(["--out", str(tmp_path), "--profile"])
    cases = bench.plan_cases(args)
    assert len(cases) == 2 * 2 * 2 * len(bench.ARMS) + len(bench.ARMS)
    first_round = [c.name for c in cases[: len(bench.ARMS)]]
    assert first_round == [f"{a.name}_e128_mbs2_r0" for a in bench.ARMS]
    assert [c.mbs for c in cases[:16]] == [2] * 8 + [1] * 8 and cases[16].repeat == 1
    assert all(c.profiled and c.experts == 8 and c.mbs == 1 for c in cases[-len(bench.ARMS) :])


@pytest.mark.host("h100", transformer_engine="2.20.2")
def test_every_case_is_a_harness_command_that_validates(bench, tmp_path, monkeypatch):
    """Each arm's command line goes through the harness's own rules (TE faked as installed, so a CPU
    host validates the GPU machine's cases; megatron-core's own deferred checks look for the real TE
    kernels and are left to the GPU run) and selects the layers it names."""
    from megatron.bridge.perf.benchmarks import benchmark_jobs
    from megatron.bridge.training.config_stages.resolution import finalize

    monkeypatch.setattr(finalize, "run_megatron_post_init", lambda cfg: None)
    args = bench.parse(["--out", str(tmp_path), "--repeats", "1", "--mbs", "1", "--experts", "8", "--profile"])
    cases = bench.plan_cases(args)
    paths, _ = benchmark_jobs.write_configs(bench.harness_argv(c, args) for c in cases)
    for case, path in zip(cases, paths):
        text = path.read_text()
        assert f"layer_spec: {case.arm.layer_spec}" in text and "num_moe_experts: 8" in text
        assert ("gradient_accumulation_fusion: true" in text) == case.arm.gradient_accumulation_fusion
        assert ("use_pytorch_profiler: true" in text) == case.profiled


def test_rows_keep_each_repeat_and_the_page_compares_with_torch_native(bench, tmp_path):
    args = bench.parse(["--out", str(tmp_path), "--mbs", "1", "--experts", "8"])
    cases = bench.plan_cases(args)
    step = {"torch_native": 0.4, "te_recipe": 0.8, "te_fused": 0.7, "te_fused_gaf": 0.6}
    for case in cases:
        (tmp_path / case.name).mkdir()
        summary = _summary(step[case.arm.name] + 0.01 * case.repeat, case.arm.layer_spec)
        (tmp_path / case.name / "summary.json").write_text(json.dumps(summary))
    rows = bench.rows(cases, args, commit="abc")
    assert [r["arm"] for r in rows] == [a.name for a in bench.ARMS]
    gaf = rows[-1]
    assert gaf["step_s"] == pytest.approx([0.6, 0.61]) and gaf["gradient_accumulation_fusion"] is True
    assert gaf["settings"]["model.num_moe_experts"] == 8 and gaf["commit"] == "abc"
    for key in ("layer_spec", "experts_per_gpu", "settings", "mbs", "step_s", "tflops_per_gpu", "peak_mem_gib"):
        assert key in gaf
    result = dict(
        date="d",
        commit="abc",
        device="1 x GPU",
        transformer_engine="2.20.2",
        torch="2.11",
        ceiling_tflops=None,
        complete=True,
        exit_code=0,
        command="cmd",
        rows=rows,
        profiles={},
    )
    page = bench.markdown_section(result)
    assert (
        "| transformer_engine | 8 | TE's fused kernels + gradient-accumulation fusion | 1 | 0.605 s (0.600 / 0.610)"
    ) in page
    assert "| 1.49x |" in page  # 0.605 s against torch-native's 0.405 s


def test_a_stopped_run_continues_with_the_cases_left(bench, tmp_path, monkeypatch):
    args = bench.parse(["--out", str(tmp_path), "--mbs", "1", "--experts", "8", "--repeats", "1"])
    cases = bench.plan_cases(args)
    for case in cases[:2]:
        (tmp_path / case.name).mkdir()
        (tmp_path / case.name / "summary.json").write_text(json.dumps(_summary(0.5, case.arm.layer_spec)))
    seen = []
    monkeypatch.setattr(bench.benchmark_jobs, "write_configs", lambda argvs: (seen.extend(argvs), ([], {}))[1])
    monkeypatch.setattr(bench.benchmark_jobs, "run_logged", lambda *a, **k: 0)
    assert bench.run_pending(cases, args) == 0
    assert [argv[argv.index("-l") + 1].rsplit("/", 1)[-1] for argv in seen] == [c.name for c in cases[2:]]


def test_a_case_that_kills_its_job_is_recorded_and_the_next_job_goes_on(bench, tmp_path, monkeypatch):
    args = bench.parse(["--out", str(tmp_path), "--mbs", "1", "--experts", "8", "--repeats", "1"])
    cases = bench.plan_cases(args)
    jobs = []

    def fake_job(argv, env, log, timeout):
        names = [a.split("/")[-2] for a in argv if a.endswith("config.yaml")]
        jobs.append(names)
        log.write_text("Traceback ...\nRuntimeError: boom")
        for name in names:
            if name.startswith("te_fused_e8"):  # the job dies in the first fused case
                return 1
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / "summary.json").write_text(json.dumps(_summary(0.5, "x")))
        return 0

    monkeypatch.setattr(bench.benchmark_jobs, "run_logged", fake_job)
    monkeypatch.setattr(
        bench.benchmark_jobs,
        "write_configs",
        lambda argvs: ([Path(a[a.index("-l") + 1]) / "config.yaml" for a in argvs], {}),
    )
    monkeypatch.setattr(bench.benchmark_jobs, "job_argv", lambda n, d, paths: [str(p) for p in paths])
    assert bench.run_pending(cases, args) == 0
    assert jobs == [[c.name for c in cases], [cases[3].name]]
    assert "boom" in bench.failure(cases[2], args)
