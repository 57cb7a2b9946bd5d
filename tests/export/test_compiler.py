"""The export compiles packages with a compiler that links libstdc++.so (one that links the C++
runtime statically made packages that crash torch's loader on the H200)."""

import os
import stat

import pytest
import torch

import flashcart.export.aoti as aoti
import flashcart.export.compiler as compiler
from flashcart.export import export_aoti

from .conftest import ethanol


def _fake_compiler(tmp_path, name: str, prints: str) -> str:
    """A 'compiler' whose -print-file-name=libstdc++.so prints ``prints``."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{prints}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_links_libstdcxx_dynamically_reads_the_compilers_library_path(tmp_path):
    lib = tmp_path / "libstdc++.so"
    lib.write_bytes(b"")
    assert compiler.links_libstdcxx_dynamically(_fake_compiler(tmp_path, "good", str(lib)))
    assert not compiler.links_libstdcxx_dynamically(_fake_compiler(tmp_path, "static", "libstdc++.so"))  # not found: .a
    assert not compiler.links_libstdcxx_dynamically(_fake_compiler(tmp_path, "gone", str(tmp_path / "nothing.so")))
    assert not compiler.links_libstdcxx_dynamically(str(tmp_path / "no-such-compiler"))


def test_a_static_runtime_compiler_is_replaced_by_one_on_the_path(tmp_path, monkeypatch):
    static = _fake_compiler(tmp_path, "static-g++", "libstdc++.so")
    lib = tmp_path / "libstdc++.so"
    lib.write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    good = _fake_compiler(bin_dir, "g++", str(lib))
    monkeypatch.setattr(compiler, "configured_compiler", lambda: static)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    chosen, why = compiler.package_compiler()
    assert chosen == good and static in why and "statically" in why
    monkeypatch.setattr(compiler, "configured_compiler", lambda: good)
    assert compiler.package_compiler() == (good, None)  # a good configured compiler is kept


def test_the_export_passes_the_chosen_compiler_to_inductor(small_model, package64, tmp_path, monkeypatch):
    seen = {}

    def compile_and_package(program, package_path, inductor_configs):
        seen.update(inductor_configs)
        __import__("shutil").copyfile(package64, package_path)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_package)
    monkeypatch.setattr(aoti, "package_compiler", lambda: ("/usr/bin/good-g++", "static-g++ does not link libstdc++.so"))
    with pytest.warns(UserWarning, match="static-g\\+\\+ does not link libstdc\\+\\+.so"):
        export_aoti(small_model, ethanol(), tmp_path / "m.pt2", torch.float64, max_images=2, check_load=False)
    assert seen["cpp.cxx"] == (None, "/usr/bin/good-g++")
    seen.clear()  # a compiler the caller chose is left alone
    export_aoti(
        small_model,
        ethanol(),
        tmp_path / "n.pt2",
        torch.float64,
        max_images=2,
        check_load=False,
        inductor_configs={"cpp.cxx": (None, "/opt/mine/g++")},
    )
    assert seen["cpp.cxx"] == (None, "/opt/mine/g++")
    monkeypatch.setattr(aoti, "package_compiler", lambda: ("/usr/bin/g++", None))
    seen.clear()
    export_aoti(small_model, ethanol(), tmp_path / "o.pt2", torch.float64, max_images=2, check_load=False)
    assert "cpp.cxx" not in seen  # inductor's own choice when it links libstdc++.so
