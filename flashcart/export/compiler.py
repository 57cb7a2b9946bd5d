"""The C++ compiler of AOTInductor packages: one that links the C++ runtime dynamically.

AOTInductor compiles a package's wrapper with the compiler inductor finds (``$CXX``, else
``g++``). A compiler that cannot link ``libstdc++.so`` links ``libstdc++.a`` into the wrapper
instead, and torch's package loader then crashes in that second copy of the C++ runtime (a
locale facet of the process's copy reached through the wrapper's own ``std::regex`` code, in
``AOTInductorModel``'s constructor). On the H200 image ``CXX=/opt/gcc/bin/g++`` is such a
compiler (a wrapper around the system g++ whose library path has ``libstdc++.a`` only): its
packages with FlashCart's Triton kernels crashed at load, and the same package compiled with
``/usr/bin/g++`` (``libstdc++.so.6`` in its ``DT_NEEDED``) loads and runs
(benchmarks/RESULTS.md, 2026-12-01 evening). :func:`package_compiler` picks a compiler that
links ``libstdc++.so`` before the export compiles anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["configured_compiler", "links_libstdcxx_dynamically", "package_compiler"]

# where to look when the configured compiler links the runtime statically
_ALTERNATIVES = ("g++", "c++", "/usr/bin/g++", "/usr/bin/c++")


def configured_compiler() -> str:
    """The C++ compiler inductor would use now (its ``cpp.cxx`` search, which reads ``CXX``)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception as e:  # messages must not fail for want of a compiler name
        return f"an unknown compiler ({type(e).__name__})"


def links_libstdcxx_dynamically(compiler: str) -> bool:
    """Whether ``compiler`` finds ``libstdc++.so`` (``-print-file-name`` prints the bare name
    when it does not, and the compiler then links ``libstdc++.a``)."""
    try:
        proc = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    found = proc.stdout.strip()
    return proc.returncode == 0 and os.path.isabs(found) and os.path.exists(found)


def package_compiler() -> tuple[str, str | None]:
    """``(compiler, why)``: the configured compiler when it links ``libstdc++.so`` (``why`` is
    then ``None``), else the first of ``g++``, ``c++`` (on ``PATH``), ``/usr/bin/g++``,
    ``/usr/bin/c++`` that does, with the reason for the switch; the configured one when none does
    (the export's load check then reports the crash)."""
    configured = configured_compiler()
    if links_libstdcxx_dynamically(configured):
        return configured, None
    seen = {configured}
    for name in _ALTERNATIVES:
        path = shutil.which(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        if links_libstdcxx_dynamically(path):
            return path, (
                f"{configured} does not link libstdc++.so (it would link the C++ runtime into the package statically, "
                f"which crashes torch's package loader); compiling with {path}"
            )
    return configured, None
