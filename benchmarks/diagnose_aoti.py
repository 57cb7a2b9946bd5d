"""Why a CUDA ``.pt2`` with the Triton kernels crashes when it is loaded (issue 12; GPU only).

Exports the export tests' tiny model (float32, Triton kernels) once, lists what the package
holds (files, the wrapper's extern calls and kernel loads), then loads it in fresh processes
that differ in one thing each (flashcart importable or not, imported first, CUDA initialised
first), with a native backtrace: gdb where the machine has it, else a SIGSEGV handler
preloaded into the process (glibc ``backtrace``; frames resolved with ``addr2line``).

    python benchmarks/diagnose_aoti.py --out /tmp/aoti
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXPORT = """
import sys, torch
sys.path.insert(0, {root!r})
import torch._inductor.cpp_builder as cb
_build = cb.CppBuilder.build
def build(self):  # the compiler command of every object and of the link (how the wrapper gets its C++ runtime)
    print("[compile]", self.get_command_line()[:1500], flush=True)
    return _build(self)
cb.CppBuilder.build = build
from flashcart.export import export_aoti
from tests.export.test_gpu_export import _triton_model
from tests.export.conftest import ethanol
export_aoti(_triton_model(), ethanol(), sys.argv[1], torch.float32, "cuda", max_images=2, triton=sys.argv[2] == "1",
            inductor_configs=eval(sys.argv[3]), check_load=False)
"""

LOAD = """
import sys, torch
{before}
print("libstdc++ mapped:", sorted(set(l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l)), flush=True)
print("loading", flush=True)
runner = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded", flush=True)
from ase.build import molecule
a = molecule("CH3CH2OH")
out = runner(torch.tensor(a.positions, dtype=torch.float32, device="cuda"), torch.tensor(a.numbers, device="cuda"),
             torch.zeros(3, 3, device="cuda"), torch.zeros(3, dtype=torch.bool, device="cuda"))
torch.cuda.synchronize()
print("ran: energy", float(out[0]), "max |force|", float(out[1].abs().max()), flush=True)
"""

VARIANTS = {
    "plain (flashcart not imported)": "",
    "flashcart imported first": f"sys.path.insert(0, {str(ROOT)!r}); import flashcart.cartesian._backend as b; b.torch_ops()",
    "CUDA initialised first": "torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
}


SEGV_HANDLER = r"""
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
static void report(int sig) {
  void *frames[64];
  int n = backtrace(frames, 64);
  const char msg[] = "native backtrace:\n";
  write(2, msg, sizeof msg - 1);
  backtrace_symbols_fd(frames, n, 2);
  _exit(128 + sig);
}
__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = report;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
"""


def segv_library(out: Path) -> Path | None:
    """A shared library that prints a native backtrace on SIGSEGV (None without a C compiler)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    src, lib = out / "segv.c", out / "libsegv.so"
    src.write_text(SEGV_HANDLER)
    rc, log = run([cc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], 60)
    if rc != 0:
        print(f"[segv handler] build failed: {log[-500:]}")
        return None
    return lib


def resolve(log: str) -> list[str]:
    """Native frames ``path(symbol+offset) [address]`` with names (addr2line, c++filt)."""
    lines = []
    a2l, filt = shutil.which("addr2line"), shutil.which("c++filt")
    for line in log.splitlines():
        m = re.match(r"(.*?)\((.*?)\+(0x[0-9a-f]+)\)\s*\[(0x[0-9a-f]+)\]", line.strip())
        if not m:
            continue
        path, sym, off, _ = m.groups()
        name = sym
        if not sym and a2l:
            rc, res = run([a2l, "-f", "-C", "-e", path, off], 30)
            name = " @ ".join(res.split("\n")[:2]) if rc == 0 else "?"
        elif sym and filt:
            rc, res = run([filt, sym], 10)
            name = res.strip() if rc == 0 else sym
        lines.append(f"{Path(path).name}: {name[:200]} +{off}")
    return lines


def run(cmd: list[str], timeout: int) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        return -999, f"timed out after {timeout} s: {e.stdout or ''}{e.stderr or ''}"


def describe(path: Path) -> None:
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        print(f"[package] {path.name}: {len(names)} files, {path.stat().st_size / 1e6:.1f} MB")
        for info in z.infolist():
            if not info.filename.endswith((".cubin", ".hsaco")):
                print(f"  {info.filename}  {info.file_size} B")
        cubins = [n for n in names if n.endswith(".cubin")]
        for name in names:  # how the wrapper links the C++ runtime (the crash of 2026-12-01 is in std::regex)
            if name.endswith(".so"):
                so = path.parent / f"{path.stem}.so"
                so.write_bytes(z.read(name))
                for tool in (["ldd", str(so)], ["nm", "-D", "-C", "--defined-only", str(so)]):
                    if shutil.which(tool[0]):
                        rc, log = run(tool, 60)
                        lines = log.splitlines()
                        if tool[0] == "nm":
                            lines = [x for x in lines if re.search(r"locale|regex|collate|ctype|codecvt", x)]
                            # libstdc++'s own (non-template) definitions: present only if parts of
                            # the C++ runtime were linked into the wrapper (2026-12-01: the crash
                            # is a virtual call that lands in codecvt<char16_t>::do_unshift)
                            own = [x for x in lines if re.search(r"do_unshift|ctype<char>::id|locale::id|locale::classic|_S_classic", x)]
                            print(f"  nm: {len(lines)} defined dynamic symbols about locale/regex; libstdc++'s own: {len(own)}")
                            lines = own[:12] + lines[:4]
                        print("    " + "\n    ".join(lines[:25]))
        print(f"  ... and {len(cubins)} .cubin files")
        for name in names:
            if name.endswith(".cpp") or name.endswith(".json") and "metadata" not in name:
                text = z.read(name).decode(errors="replace")
                pats = [
                    "proxy_executor",
                    "aoti_torch_proxy",
                    "loadKernel",
                    "launchKernel",
                    "global_scratch",
                    "profile_scratch",
                    "flashcart",
                ]
                counts = {p: len(re.findall(p, text)) for p in pats}
                print(f"  {name}: " + ", ".join(f"{p}={c}" for p, c in counts.items() if c))
                if name.endswith(".json"):
                    print("    " + text[:1500].replace("\n", "\n    "))
                if name.endswith("wrapper.cpp"):
                    info = re.findall(r"constants_info_\[(\d+)\]\.(\w+) = (.*?);", text)
                    by_index: dict = {}
                    for i, key, value in info:
                        by_index.setdefault(int(i), {})[key] = value[:120]
                    print(f"  constants: {len(by_index)}")
                    for i, c in sorted(by_index.items()):
                        odd = c.get("data_size") == "0" or "cpu" in c.get("original_fqn", "")
                        if odd or i < 6:
                            print(
                                f"    [{i}]{' (empty)' if c.get('data_size') == '0' else ''} " + ", ".join(f"{k}={v}" for k, v in c.items())
                            )
                for p in ("proxy_executor", "flashcart", "global_scratch"):
                    for m in list(re.finditer(p, text))[:3]:
                        line_start = text.rfind("\n", 0, m.start()) + 1
                        print(f"    | {text[line_start : text.find(chr(10), m.end())][:220]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="/tmp/aoti")
    p.add_argument("--configs", nargs="*", default=["{}"], help="inductor_configs dicts, one package per entry")
    p.add_argument("--no-triton-too", action="store_true", help="also the package of inductor's kernels (it loads), to compare")
    p.add_argument("--export-timeout", type=float, default=400, help="s for all exports together")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gdb = shutil.which("gdb")
    print(f"gdb: {gdb}")
    cases = [(c, "1") for c in args.configs] + ([("{}", "0")] if args.no_triton_too else [])
    rc, log = run(["bash", "-c", "g++ --version | head -1; gcc --version | head -1; ld --version | head -1"], 30)
    print(log)
    # every package at once (compiling the wrappers takes minutes each, on one core each)
    t = time.perf_counter()
    procs = []
    for i, (configs, triton) in enumerate(cases):
        path = out / f"m{i}.pt2"
        cmd = [sys.executable, "-X", "faulthandler", "-c", EXPORT.format(root=str(ROOT)), str(path), triton, configs]
        log_file = out / f"export{i}.log"  # a file, not a pipe: a full pipe would stall the export
        with open(log_file, "w") as f:
            procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True), log_file))
    logs = []
    for proc, log_file in procs:
        try:
            rc = proc.wait(timeout=max(10, args.export_timeout - (time.perf_counter() - t)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -999
        logs.append((rc, log_file.read_text()))
    for i, ((configs, triton), (rc, log)) in enumerate(zip(cases, logs)):
        path = out / f"m{i}.pt2"
        print(f"\n=== package {i}: triton={triton} inductor_configs={configs}")
        print(f"[export] rc={rc} (all exports together: {time.perf_counter() - t:.0f} s)")
        for line in log.splitlines():
            if line.startswith("[compile]"):
                print("  " + line)
        if rc != 0:
            print(log[-3000:])
            continue
        describe(path)
        lib = None if gdb else segv_library(out)
        if lib is not None:  # first: where the plain load crashes, natively
            code = LOAD.format(before="")
            env_cmd = ["env", f"LD_PRELOAD={lib}", sys.executable, "-c", code, str(path)]
            rc, log = run(env_cmd, 90)
            print(f"[load with the SIGSEGV handler] rc={rc}")
            print("    " + "\n    ".join(log[-1500:].splitlines()[:12]))
            print("[native frames]\n    " + "\n    ".join(resolve(log)[:40]))
        for label, before in VARIANTS.items():
            code = LOAD.format(before=before)
            rc, log = run([sys.executable, "-X", "faulthandler", "-c", code, str(path)], 60)
            print(f"[load: {label}] rc={rc}")
            print("    " + log[-2500:].strip().replace("\n", "\n    "))
            if rc < 0 and gdb and label.startswith("plain"):
                script = out / "load.py"
                script.write_text(code)
                rc, log = run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, str(script), str(path)], 180)
                frames = [line for line in log.splitlines() if line.startswith("#") or "SIG" in line]
                print("[gdb backtrace]\n    " + "\n    ".join(frames[:45]))


if __name__ == "__main__":
    main()
