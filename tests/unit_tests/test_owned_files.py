"""The one writer under run and checkpoint directories never writes or deletes through a planted link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from megatron.bridge.utils import owned_files
from megatron.bridge.utils.owned_files import UnsafePathError


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the run directory that a planted link points at."""
    target = tmp_path / "outside" / "precious.txt"
    target.parent.mkdir()
    target.write_text("precious")
    return target


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


WRITERS = {
    "create_new": lambda p: owned_files.create_new(p, "new"),
    "open_new": lambda p: owned_files.open_new(p).close(),
    "open_append": lambda p: owned_files.open_append(p).close(),
}


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS.keys())
def test_a_writer_refuses_a_planted_link_and_leaves_its_target(write, run_dir: Path, victim: Path) -> None:
    link = run_dir / "summary.json"
    link.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write(link)
    assert victim.read_text() == "precious"


def test_replace_replaces_the_link_itself_never_its_target(run_dir: Path, victim: Path) -> None:
    link = run_dir / "latest_checkpointed_iteration.txt"
    link.symlink_to(victim)
    owned_files.replace_file(link, "10", durable=True)
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "10"
    assert sorted(p.name for p in run_dir.iterdir()) == ["latest_checkpointed_iteration.txt"]


def test_replace_ignores_a_link_planted_at_a_temporary_name(run_dir: Path, victim: Path, monkeypatch) -> None:
    (run_dir / ".tracker.fixed.tmp").symlink_to(victim)
    monkeypatch.setattr(owned_files.secrets, "token_hex", lambda n: "fixed")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        owned_files.replace_file(run_dir / "tracker", "10")
    assert victim.read_text() == "precious"


def test_append_refuses_a_hard_link_to_another_file(run_dir: Path, victim: Path) -> None:
    os.link(victim, run_dir / "launch.log")
    with pytest.raises(UnsafePathError, match="hard links"):
        owned_files.open_append(run_dir / "launch.log")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("make", [owned_files.make_dir, owned_files.make_fresh_dir], ids=["make_dir", "make_fresh_dir"])
def test_a_directory_planted_as_a_link_is_refused(make, run_dir: Path, victim: Path) -> None:
    (run_dir / "failures").symlink_to(victim.parent)
    with pytest.raises(UnsafePathError):
        make(run_dir / "failures")


def test_remove_unlinks_a_link_and_keeps_what_it_points_at(run_dir: Path, victim: Path) -> None:
    (run_dir / "failures").symlink_to(victim.parent)
    (run_dir / "launch.log").symlink_to(victim)
    owned_files.remove(run_dir / "failures")
    owned_files.remove(run_dir / "launch.log")
    assert victim.read_text() == "precious" and list(run_dir.iterdir()) == []


def test_remove_of_a_tree_never_follows_a_link_inside_it(run_dir: Path, victim: Path) -> None:
    tree = run_dir / "failures"
    tree.mkdir()
    (tree / "escape").symlink_to(victim.parent)
    owned_files.remove(tree)
    assert victim.read_text() == "precious" and not tree.exists()


def test_unsafe_entries_names_every_link_at_any_depth(run_dir: Path, victim: Path) -> None:
    (run_dir / "config.yaml").symlink_to(victim)
    (run_dir / "torchrun").mkdir()
    (run_dir / "torchrun" / "attempt").symlink_to(victim.parent)
    found = owned_files.unsafe_entries(run_dir)
    assert len(found) == 2 and all("symbolic link" in entry for entry in found)
    top = owned_files.unsafe_entries(run_dir, recursive=False)
    assert len(top) == 1 and "config.yaml" in top[0]


def test_a_long_list_of_unsafe_entries_is_bounded() -> None:
    text = owned_files.describe_unsafe([f"entry {i}" for i in range(1000)])
    assert text.count("\n") == owned_files.MAX_LISTED and "990 more" in text
