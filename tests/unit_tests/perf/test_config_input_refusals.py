"""What a config file or an override may say, through the harness's entry point: a malformed value,
a YAML tag, a resolver or a name outside the allowed lists is one listed problem naming the
override or field and why (exit 2, nothing launched, nothing imported); a ``${section.field}``
reference is the value of that field."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml

from megatron.bridge.perf.run import main

TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2"]
PLANTED = "planted_by_config_test"
"""A module that records its own import: a config that names it must not import it."""


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Path:
    """``PLANTED`` on ``sys.path``; its import writes the returned marker file."""
    marker = tmp_path / "imported"
    (tmp_path / f"{PLANTED}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\ndef act(x):\n    return x\n"
        "class Provider:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop(PLANTED, None)


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


# override -> (rule id, texts the message must hold)
MALFORMED_OVERRIDES = {
    "tokenizer.tokenizer_model=`id`": ("override-value-syntax", ["not a valid YAML value", "fix:"]),
    "model.num_layers=[1,2": ("override-value-syntax", ["'model.num_layers=[1,2'", "bracket closed"]),
    "model.num_layers='abc": ("override-value-syntax", ["not a valid YAML value", "quote"]),
    "model.num_layers=${oc.env:UNSET}": ("override-reference", ["resolver 'oc.env'", "not evaluated"]),
    "model.num_layers=${model.no_such_field}": ("override-reference", ["names no field", "model.no_such_field"]),
    "model.num_layers=${model.num_layers": ("override-reference", ["cannot be read"]),
    "model.num_layers=!!python/object/apply:os.system [id]": ("override-value-syntax", ["YAML tags are not read"]),
    f"model.activation_func={PLANTED}.act": ("config-callable-not-allowed", ["torch.nn.functional.*"]),
    "model.activation_func=os.system": ("config-callable-not-allowed", ["an activation function"]),
    f"model._target_={PLANTED}.Provider": ("config-target-not-allowed", ["Qwen3MoEModelProvider"]),
}


@pytest.mark.parametrize("override", sorted(MALFORMED_OVERRIDES))
def test_malformed_override_is_one_listed_problem(override, tmp_path, no_launch, planted):
    rule, texts = MALFORMED_OVERRIDES[override]
    code, text = run([*TINY_CPU, "-l", str(tmp_path / "run"), override])
    assert code == 2, text
    assert f"[{rule}]" in text and "1 problem(s)" in text and "nothing was launched" in text, text
    assert "Traceback" not in text
    for fragment in texts:
        assert fragment in text, (fragment, text)
    assert not planted.exists(), "a name in a config was imported"


def test_every_malformed_override_is_listed_at_once(tmp_path, no_launch):
    code, text = run([*TINY_CPU, "-l", str(tmp_path / "run"), "model.num_layers=[1,2", "model.hidden_size='abc",
                      "model.hidden_size=${oc.env:HOME}"])
    assert code == 2 and "3 problem(s)" in text, text


# YAML file text -> (rule id, texts the message must hold)
MALFORMED_FILES = {
    f"model:\n  _target_: {PLANTED}.Provider\n": ("config-target-not-allowed", ["model._target_"]),
    f"model:\n  activation_func: {PLANTED}.act\n": ("config-callable-not-allowed", ["model.activation_func"]),
    "model:\n  num_layers: !!python/object/apply:os.system [id]\n": ("yaml-syntax", ["YAML tag", "line 2"]),
    "model:\n  num_layers: ${oc.env:HOME}\n": ("override-reference", ["resolver 'oc.env'"]),
}


@pytest.mark.parametrize("text", sorted(MALFORMED_FILES), ids=lambda t: t.splitlines()[1].strip()[:40])
def test_config_file_names_nothing_outside_the_allowed_lists(text, tmp_path, no_launch, planted):
    rule, fragments = MALFORMED_FILES[text]
    path = tmp_path / "overlay.yaml"
    path.write_text(text)
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run"), "--config_file", str(path)])
    assert code == 2 and f"[{rule}]" in out and "nothing was launched" in out, out
    for fragment in fragments:
        assert fragment in out, (fragment, out)
    assert not planted.exists(), "a name in a config file was imported"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model.num_layers=${model.num_attention_heads}"], {"num_layers": 4}),
        (["model.num_attention_heads=2", "model.num_layers=${model.num_attention_heads}"], {"num_layers": 2}),
        (["model.ffn_hidden_size=${model.hidden_size}"], {"ffn_hidden_size": 128}),
    ],
    ids=["config-value", "same-layer-value", "another-field"],
)
def test_a_reference_is_the_fields_value(overrides, expected, tmp_path, no_launch):
    saved = tmp_path / "saved.yaml"
    code, text = run([*TINY_CPU, "--dryrun", "-l", str(tmp_path / "run"), "--save_config_filepath", str(saved),
                      *overrides])
    assert code == 0, text
    model = yaml.safe_load(saved.read_text())["model"]
    assert {k: model[k] for k in expected} == expected
    assert "${" not in saved.read_text()
