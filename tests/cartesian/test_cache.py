"""Generated-source cache: reuse, regeneration, corruption, concurrency, fallback."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flashcart
from flashcart.cartesian import _cache

LOAD = textwrap.dedent(
    """
    import sys, time
    from flashcart.cartesian._backend import torch_ops, KERNEL_L_MAX
    from flashcart.cartesian import TensorProduct
    import torch
    ops = torch_ops()
    tp = TensorProduct(1, 1, 2, 1, 1, backend="torch")
    out = tp(torch.ones(1, 4), torch.ones(1, 4), torch.ones(1, tp.weight_numel))
    assert torch.isfinite(out).all()
    print(ops.__file__)
    """
)


def run_load(cache: Path, l_max: int = 2, **extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLASHCART_CACHE_DIR": str(cache), "FLASHCART_KERNEL_L_MAX": str(l_max), **extra}
    return subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=120)


def generated_files(cache: Path) -> list[Path]:
    return sorted((cache / "generated").glob("torch_ops_*.py"))


def test_sources_are_generated_once_then_reused(tmp_path):
    first = run_load(tmp_path)
    assert first.returncode == 0, first.stderr
    [path] = generated_files(tmp_path)
    stamp = path.stat().st_mtime_ns
    second = run_load(tmp_path)
    assert second.returncode == 0, second.stderr
    assert generated_files(tmp_path) == [path]
    assert path.stat().st_mtime_ns == stamp
    assert second.stdout.strip() == str(path)


def test_changing_rank_limit_generates_new_sources(tmp_path):
    assert run_load(tmp_path, l_max=2).returncode == 0
    assert run_load(tmp_path, l_max=3).returncode == 0
    names = [p.name for p in generated_files(tmp_path)]
    assert len(names) == 2 and any("_l2_" in n for n in names) and any("_l3_" in n for n in names)


def test_package_version_is_part_of_the_key(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHCART_CACHE_DIR", str(tmp_path))
    _cache.generator_digest.cache_clear()
    before = _cache.generated_path("torch_ops", 3)
    monkeypatch.setattr(flashcart, "__version__", "999.0")
    _cache.generator_digest.cache_clear()
    after = _cache.generated_path("torch_ops", 3)
    _cache.generator_digest.cache_clear()
    assert before != after


@pytest.mark.parametrize("damage", ["truncate", "garble", "empty"])
def test_corrupted_cache_file_is_regenerated(tmp_path, damage):
    assert run_load(tmp_path).returncode == 0
    [path] = generated_files(tmp_path)
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "garble":
        path.write_text(text.replace("0.75", "0.5", 1))
    else:
        path.write_text("")
    result = run_load(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "regenerating corrupted" in result.stderr
    assert path.read_text() == text


def test_two_processes_generating_at_once_both_succeed(tmp_path):
    env = {**os.environ, "FLASHCART_CACHE_DIR": str(tmp_path), "FLASHCART_KERNEL_L_MAX": "4"}
    procs = [
        subprocess.Popen([sys.executable, "-c", LOAD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    assert len(generated_files(tmp_path)) == 1
    assert not list((tmp_path / "generated").glob("*.tmp"))


def test_unwritable_cache_dir_falls_back_with_a_warning(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    result = run_load(blocker / "cache")
    assert result.returncode == 0, result.stderr
    assert "cannot write its generated-source cache" in result.stderr
    assert "FLASHCART_CACHE_DIR" in result.stderr


def test_invalid_rank_limit_is_a_clear_error(tmp_path):
    result = run_load(tmp_path, l_max="three")
    assert result.returncode != 0
    assert "FLASHCART_KERNEL_L_MAX must be a non-negative integer" in result.stderr


def test_cache_location_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("FLASHCART_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache_dir() == tmp_path / "xdg" / "flashcart"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _cache.cache_dir() == tmp_path / "home" / ".cache" / "flashcart"
    monkeypatch.setenv("FLASHCART_CACHE_DIR", str(tmp_path / "explicit"))
    assert _cache.cache_dir() == tmp_path / "explicit"
