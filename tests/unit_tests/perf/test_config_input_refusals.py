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

from megatron.bridge.perf.harness.run import main

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


def _short_id(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


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
    "checkpoint.save=!!binary aGVsbG8=": ("override-value-syntax", ["YAML tags are not read (!!binary)"]),
    "model.num_layers=!!int abc": ("override-value-syntax", ["YAML tags are not read (!!int)"]),
    "model.num_layers={a: 1, a: 2}": ("override-value-syntax", ["the key a is given twice", "give the key once"]),
    "model.num_layers=" + "1" * 5000: ("override-value-syntax", ["a number of 5,000 digits"]),
    "model.num_layers=" + "{a: " * 400 + "1" + "}" * 400: ("override-value-syntax", ["nest deeper than 32 levels"]),
}


@pytest.mark.parametrize("override", sorted(MALFORMED_OVERRIDES), ids=_short_id)
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
    code, text = run(
        [
            *TINY_CPU,
            "-l",
            str(tmp_path / "run"),
            "model.num_layers=[1,2",
            "model.hidden_size='abc",
            "model.hidden_size=${oc.env:HOME}",
        ]
    )
    assert code == 2 and "3 problem(s)" in text, text


# YAML file text -> (rule id, texts the message must hold)
MALFORMED_FILES = {
    f"model:\n  _target_: {PLANTED}.Provider\n": ("config-target-not-allowed", ["model._target_"]),
    f"model:\n  activation_func: {PLANTED}.act\n": ("config-callable-not-allowed", ["model.activation_func"]),
    "model:\n  num_layers: !!python/object/apply:os.system [id]\n": ("yaml-syntax", ["YAML tag", "line 2"]),
    "model:\n  num_layers: ${oc.env:HOME}\n": ("override-reference", ["resolver 'oc.env'"]),
}

# YAML file text -> (rule id, texts the message must hold): valid YAML that is not plain data, each with its own reason
NOT_PLAIN_FILES = {
    "binary tag": (
        "checkpoint:\n  save: !!binary aGVsbG8=\n",
        "yaml-syntax",
        ["line 2, column 9", "YAML tags are not read (!!binary at checkpoint.save)"],
    ),
    "set tag": (
        "model:\n  num_layers: !!set {a, b}\n",
        "yaml-syntax",
        ["YAML tags are not read (!!set at model.num_layers)"],
    ),
    "duplicate key": (
        "model:\n  num_layers: 4\n  num_layers: 5\n",
        "yaml-duplicate-key",
        ["line 3", "the key model.num_layers is given twice (lines 2 and 3)", "give the key once"],
    ),
    "node limit": (
        "a: &a ["
        + ", ".join(["x"] * 20)
        + "]\nb: &b ["
        + ", ".join(["*a"] * 20)
        + "]\nc: ["
        + ", ".join(["*b"] * 30)
        + "]\n",
        "yaml-too-large",
        ["more than 10,000 YAML nodes", "fewer *aliases"],
    ),
    "recursive alias": ("model: &m\n  inner: *m\n", "yaml-syntax", ["inside the node it names", "model.inner"]),
    "deep nesting": ("model: " + "{a: " * 40 + "1" + "}" * 40 + "\n", "yaml-too-large", ["nest deeper than 32 levels"]),
    "long number": ("model:\n  num_layers: " + "1" * 5000 + "\n", "yaml-syntax", ["a number of 5,000 digits"]),
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN_FILES))
def test_a_config_file_that_is_not_plain_data_is_refused_with_its_own_reason(case, tmp_path, no_launch):
    text, rule, fragments = NOT_PLAIN_FILES[case]
    path = tmp_path / "overlay.yaml"
    path.write_text(text)
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run"), "--config_file", str(path)])
    assert code == 2 and f"[{rule}]" in out and "1 problem(s)" in out and "nothing was launched" in out, out
    assert "Traceback" not in out and "a YAML tag" not in out, out
    for fragment in fragments:
        assert fragment in out, (fragment, out)


def test_every_problem_of_a_config_file_is_listed_at_once(tmp_path, no_launch):
    path = tmp_path / "overlay.yaml"
    path.write_text("model:\n  num_layers: !!binary aGVsbG8=\n  num_layers: 3\ncheckpoint:\n  save: !!set {a}\n")
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run"), "--config_file", str(path)])
    assert code == 2 and "3 problem(s)" in out and "[yaml-duplicate-key]" in out and out.count("[yaml-syntax]") == 2, (
        out
    )


# file bytes -> texts the refusal holds
UNREADABLE_FILES = {
    "utf-16": ("model:\n  num_layers: 4\n".encode("utf-16"), ["is not UTF-8 text: it is UTF-16 text", "iconv"]),
    "utf-16 without a byte-order mark": ("model:\n  num_layers: 4\n".encode("utf-16-le"), ["holds NUL bytes"]),
    "binary": (bytes(range(256)), ["holds NUL bytes (the first at byte 0)"]),
    "latin-1": ("model:\n  name: caf\u00e9\n".encode("latin-1"), ["byte 18 (0xe9) is not UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_FILES))
def test_a_config_file_that_is_not_utf8_text_is_refused(case, tmp_path, no_launch):
    data, fragments = UNREADABLE_FILES[case]
    path = tmp_path / "overlay.yaml"
    path.write_bytes(data)
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run"), "--config_file", str(path)])
    assert code == 2 and "[yaml-not-utf8]" in out and "nothing was launched" in out and "Traceback" not in out, out
    for fragment in fragments:
        assert fragment in out, (fragment, out)


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("/tmp/" + "a" * 300 + "/overlay.yaml", "a name in it is 300 bytes long (at most 255)"),
        ("/tmp/" + "abc/" * 1100 + "overlay.yaml", "it is 4,417 bytes long (at most 4095)"),
    ],
    ids=["name-over-255", "path-over-4096"],
)
def test_a_config_file_path_no_file_system_opens_is_refused(path, fragment, tmp_path, no_launch):
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run"), "--config_file", path])
    assert code == 2 and "[yaml-path-too-long]" in out and fragment in out and "nothing was launched" in out, out
    assert len(out) < 2000, "the message repeats the whole path"


@pytest.mark.parametrize("family", ["nonexist.sub", "..training", "qwen.sub", "os"])
def test_a_model_family_that_is_no_recipe_package_is_refused_listing_the_families(family, tmp_path, no_launch):
    code, out = run(["-m", family, *TINY_CPU, "-l", str(tmp_path / "run")])
    assert code == 2 and "[model-family-known]" in out and f"unknown model family {family!r}" in out, out
    assert "available: qwen" in out and "nothing was launched" in out and "Traceback" not in out, out


SCRATCH = "tokenizer.hf_tokenizer_kwargs"
"""An open dict of the config: keys of any name, for references between overrides (a misspelt name
elsewhere is refused before any reference is read)."""


def _doubling_overrides(tmp: Path, n: int = 16) -> list[str]:
    """``k{i}=${k{i+1}}${k{i+1}}``: each line doubles the value (2**n characters unbounded)."""
    return [f"{SCRATCH}.k{i}=${{{SCRATCH}.k{i + 1}}}${{{SCRATCH}.k{i + 1}}}" for i in range(n)] + [f"{SCRATCH}.k{n}=ab"]


def _doubling_file(tmp: Path, n: int = 16) -> list[str]:
    path = tmp / "overlay.yaml"
    path.write_text("x:\n" + "".join(f"  k{i}: ${{x.k{i + 1}}}${{x.k{i + 1}}}\n" for i in range(n)) + f"  k{n}: ab\n")
    return ["--config_file", str(path)]


def _doubling_lists(tmp: Path, n: int = 14) -> list[str]:
    return [f"{SCRATCH}.k{i}=['${{{SCRATCH}.k{i + 1}}}', '${{{SCRATCH}.k{i + 1}}}']" for i in range(n)] + [
        f"{SCRATCH}.k{n}=1"
    ]


def _long_chain(tmp: Path, n: int = 600) -> list[str]:
    """``k{i}=${k{i+1}}``: a chain as deep as Python's recursion limit."""
    return [f"{SCRATCH}.k{i}=${{{SCRATCH}.k{i + 1}}}" for i in range(n)] + [f"{SCRATCH}.k{n}=ab"]


# case -> (argv built under tmp_path, rule id, texts the message must hold)
UNBOUNDED_REFERENCES = {
    "doubling overrides": (
        _doubling_overrides,
        "override-reference-size",
        [f"{SCRATCH}.k3=", "longer than 8,192 characters"],
    ),
    "doubling yaml lines": (_doubling_file, "override-reference-size", ["x.k3=", "longer than 8,192 characters"]),
    "doubling lists": (_doubling_lists, "override-reference-size", [f"{SCRATCH}.k3=", "longer than 8,192 characters"]),
    "chain deeper than the recursion limit": (
        _long_chain,
        "override-reference-depth",
        [f"{SCRATCH}.k583=", f"17 references in a row ({SCRATCH}.k583 -> {SCRATCH}.k584 ->", "at most 16 are followed"],
    ),
}


@pytest.mark.parametrize("case", sorted(UNBOUNDED_REFERENCES))
def test_references_that_would_grow_without_bound_are_one_short_listed_problem(case, tmp_path, no_launch):
    """Each reference is resolved once and a value made of references is bounded in size and depth,
    so the answer comes at once and its message stays short (it printed every expanded value)."""
    extra, rule, fragments = UNBOUNDED_REFERENCES[case]
    code, out = run([*TINY_CPU, "-l", str(tmp_path / "run"), *extra(tmp_path)])
    assert code == 2 and out.count(f"[{rule}]") == 1 and "nothing was launched" in out and "Traceback" not in out, out
    for fragment in fragments:
        assert fragment in out, (fragment, out)
    assert len(out) < 4000, f"a message of {len(out)} characters"


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
    code, text = run(
        [*TINY_CPU, "--dryrun", "-l", str(tmp_path / "run"), "--save_config_filepath", str(saved), *overrides]
    )
    assert code == 0, text
    model = yaml.safe_load(saved.read_text())["model"]
    assert {k: model[k] for k in expected} == expected
    assert "${" not in saved.read_text()
