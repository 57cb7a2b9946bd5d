"""``flashcart-profile``: time inference and training computations of a fresh model.

Measures through the same :class:`~flashcart.model.Predictor` that simulations use. Data
loading, neighbour lists, pre-fit and transfers happen before timing; warm-up runs are not
timed; CUDA is synchronised around every timed region. Output lines follow the published
tool (``[inference]``, ``[timer]``, ``[training]``, ``[phase-timer]``, ``[trace]``, ``[cuda]``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from .cartesian import KERNEL_L_MAX
from .config import ConfigError
from .data import BatchLoader, read_structures
from .model.potential import FlashCartPotential
from .model.predictor import Predictor
from .model.prefit import prefit
from .nn.radial_table import MIN_INTERVALS
from .training.losses import loss_value, required_properties
from .training.trainer import infer_elements
from .utils.device import resolve_device

__all__ = ["profile", "FLASHCART_OPS", "host_and_gpu_time"]

# Profiler event names that belong to FlashCart (custom ops and generated Triton kernels).
FLASHCART_OPS = ("flashcart::", "tp_fwd", "tp_bwd", "expansion_", "grouped_matmul", "lin_")


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (a :class:`torch.device` or its name)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load_batches(path: str, cfg: dict[str, Any], batch_size: int, model: FlashCartPotential, device, progress: bool):
    structures = read_structures(path, cfg["r_max"], cfg["energy_key"], cfg["forces_key"], cfg["stress_key"], progress)
    loader = BatchLoader(structures, batch_size, model.z_to_type.cpu(), cfg["profile_dynamic_batching"])
    batches = []
    for k, b in enumerate(loader):
        if k == cfg["profile_n_batches"]:
            break
        batches.append(b.to(device, torch.get_default_dtype()))
    synchronize(device)
    return structures, batches


def _describe(tag: str, path: str, batches) -> str:
    s = sum(b.n_graphs for b in batches)
    a = sum(b.positions.shape[0] for b in batches)
    e = sum(b.receivers.shape[0] for b in batches)
    return f"[{tag}] data={path} batches={len(batches)}, structures={s}, atoms={a}, edges={e}"


def _time(fn: Callable[[], None], warmup: int, repeat: int, device) -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize(device)
    return time.perf_counter() - t0


def time_per_call(fn: Callable[[], None], repeat: int, device, warmup: int = 3) -> float:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then ``repeat`` timed ones, synchronised."""
    return _time(fn, warmup, repeat, device) / repeat


_SLEEP_CYCLES_PER_MS: dict[int, float] = {}


def _sleep_cycles_per_ms(device: torch.device) -> float:
    """Cycles per millisecond of ``torch.cuda._sleep`` on ``device``: a 10**7-cycle sleep timed by
    CUDA events, once per device and process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SLEEP_CYCLES_PER_MS:
        with torch.cuda.device(index):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            torch.cuda._sleep(10**7)
            end.record()
            torch.cuda.synchronize()
            _SLEEP_CYCLES_PER_MS[index] = 10**7 / max(start.elapsed_time(end), 1e-3)
    return _SLEEP_CYCLES_PER_MS[index]


def host_and_gpu_time(fn: Callable[[], None], repeat: int, device) -> tuple[float, float | None]:
    """Which side bounds back-to-back calls of ``fn`` on a CUDA ``device``: ``(host, gpu)`` in
    seconds per call, after one untimed call.

    ``host``: ``repeat`` calls issued back to back, timed from the first call to the last one's
    return, before synchronising (the host's issue time; the GPU runs behind it). ``gpu``: the
    same calls queued behind a sleep kernel that holds the GPU until the host has issued them all,
    timed by CUDA events around them, so the host's gaps between calls do not count (the GPU's own
    time per call). ``gpu`` is ``None`` when issuing the calls outlasted the sleep: a call waited
    for the GPU (a synchronisation inside it), and the two sides cannot be told apart. The time of
    calls issued back to back and synchronised once (:func:`time_per_call`) is about the larger of
    the two.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"host_and_gpu_time times CUDA calls, got device {device}")
    fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize(device)
    sleep_ms = 2e3 * host + 10.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        torch.cuda._sleep(int(sleep_ms * _sleep_cycles_per_ms(device)))
        t0 = time.perf_counter()
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        issued_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize(device)
    gpu = start.elapsed_time(end) * 1e-3 / repeat if issued_ms < sleep_ms else None
    return host / repeat, gpu


def _host_gpu_line(label: str, fn: Callable[[], None], repeat: int, device) -> str:
    """The ``[host-gpu]`` line of a phase: :func:`host_and_gpu_time` and the side that bounds it."""
    host, gpu = host_and_gpu_time(fn, repeat, device)
    if gpu is None:
        return f"[host-gpu] {label}: host issue {host:.6f} s/run, GPU alone n/a (a call waits for the GPU)"
    return f"[host-gpu] {label}: host issue {host:.6f} s/run, GPU alone {gpu:.6f} s/run ({'host' if host > gpu else 'GPU'}-bound)"


def _op_tables(fn: Callable[[], None], label: str, cfg: dict[str, Any], device, out: Callable[[str], None]) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(
        activities=activities,
        record_shapes=cfg["profile_record_shapes"],
        profile_memory=cfg["profile_memory"],
        with_stack=cfg["profile_with_stack"],
    ) as prof:
        fn()
        synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages(group_by_input_shape=cfg["profile_record_shapes"])
    out(f"[profile] {label}: operations by {sort} (top {cfg['profile_row_limit']})")
    out(events.table(sort_by=sort, row_limit=cfg["profile_row_limit"]))
    ours = [e for e in events if any(tag in e.key for tag in FLASHCART_OPS)]
    ours.sort(key=lambda e: -(e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total))
    out(f"[profile] {label}: FlashCart and Triton operations")
    out(f"{'name':<48} {'calls':>7} {'self CPU ms':>12} {'device ms':>11}")
    for e in ours[: cfg["profile_row_limit"]]:
        out(f"{e.key[:48]:<48} {e.count:>7d} {e.self_cpu_time_total / 1e3:>12.3f} {e.device_time_total / 1e3:>11.3f}")
    out("[profile] note: table times include profiler overhead; use the [timer] lines for elapsed time")
    if cfg["profile_trace_dir"]:
        trace_dir = Path(cfg["profile_trace_dir"])
        trace_dir.mkdir(parents=True, exist_ok=True)
        path = trace_dir / f"{label}.json"
        prof.export_chrome_trace(str(path))
        out(f"[trace] wrote {path}")


def profile(cfg: dict[str, Any], progress: bool = True, out: Callable[[str], None] = print) -> dict[str, float]:
    """Run the profiler for a merged configuration; returns the measured s/run per phase."""
    data_path = cfg["profile_data_path"] or cfg["train_path"]
    train_path = cfg["profile_train_path"] or cfg["train_path"] or cfg["profile_data_path"]
    phases = ["inference", "training"] if cfg["profile_phase"] == "both" else [cfg["profile_phase"]]
    if "inference" in phases and not data_path:
        raise ConfigError("flashcart-profile needs 'profile_data_path' or 'train_path' for the inference phase")
    if "training" in phases and not train_path:
        raise ConfigError("flashcart-profile needs 'profile_train_path', 'train_path' or 'profile_data_path' for training")
    device = resolve_device(cfg["device"])
    fit_path = train_path or data_path
    fit_structures = read_structures(fit_path, cfg["r_max"], cfg["energy_key"], cfg["forces_key"], cfg["stress_key"], progress)
    elements = cfg["elements"] or infer_elements(fit_structures)
    model = FlashCartPotential.from_config(cfg, elements)
    if cfg["profile_pre_fit"]:
        prefit(model, fit_structures, cfg["atomic_shifts"], cfg["fit_atomic_shifts"])
    model.to(device)
    intervals = cfg["profile_radial_table"]
    if intervals and intervals < MIN_INTERVALS:
        raise ConfigError(f"profile_radial_table must be 0 (the radial MLPs) or at least {MIN_INTERVALS} intervals, got {intervals}")
    predictor = Predictor(
        model,
        compile=cfg["profile_compile_predict"],
        compile_mode=cfg["profile_compile_mode"],
        compile_fullgraph=cfg["profile_compile_fullgraph"],
        pad=False,
    )
    n_params = sum(p.numel() for p in model.parameters())
    out(f"[model] parameters={n_params} elements={model.elements}")
    out(
        f"[settings] device={device} dtype={torch.get_default_dtype()} use_triton={cfg['use_triton']} "
        f"kernel_l_max={KERNEL_L_MAX} compile={cfg['profile_compile_predict']} compile_mode={cfg['profile_compile_mode']} "
        f"fullgraph={cfg['profile_compile_fullgraph']} tf32={torch.backends.cuda.matmul.allow_tf32} "
        f"radial_table={intervals or 'off'}"
    )
    results = {}
    if "inference" in phases:
        _, batches = _load_batches(data_path, cfg, cfg["profile_batch_size"], model, device, progress)

        def inference():
            # parameters frozen once per pass, as a simulation's engine holds them (a call with
            # parameters that require grad freezes and thaws every one of them itself)
            with predictor.frozen():
                for b in batches:
                    predictor(b, forces=True)

        if intervals:  # the inference phase's radial MLPs as tables (training always evaluates them)
            try:
                model.set_radial_tables(intervals)
            except ValueError as e:
                raise ConfigError(f"profile_radial_table={intervals}: {e}") from None
        out(_describe("inference", data_path, batches))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        total = _time(inference, cfg["profile_warmup"], cfg["profile_repeat"], device)
        results["inference"] = total / cfg["profile_repeat"]
        out(f"[timer] inference fwd+bwd: {total:.6f} s total, {results['inference']:.6f} s/run")
        if device.type == "cuda":
            out(_host_gpu_line("inference", inference, cfg["profile_repeat"], device))
        _op_tables(inference, "inference", cfg, device, out)
        if device.type == "cuda":
            out(f"[cuda] peak allocated during inference: {torch.cuda.max_memory_allocated(device) / 2**20:.1f} MiB")
        model.set_radial_tables(None)
    if "training" in phases:
        size = cfg["profile_train_batch_size"] or cfg["profile_batch_size"]
        _, batches = _load_batches(train_path, cfg, size, model, device, progress)
        props = required_properties(cfg["train_loss"])
        phase_time = {"predict_create_graph": 0.0, "loss": 0.0, "backward_dbwd": 0.0}

        def step(timed: bool):
            for b in batches:
                t0 = time.perf_counter()
                pred = predictor(b, forces="forces" in props, stress="stress" in props, create_graph=True)
                if timed:
                    synchronize(device)
                    t1 = time.perf_counter()
                loss = loss_value(cfg["train_loss"], pred, b)
                if timed:
                    synchronize(device)
                    t2 = time.perf_counter()
                grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
                del grads
                if timed:
                    synchronize(device)
                    t3 = time.perf_counter()
                    phase_time["predict_create_graph"] += t1 - t0
                    phase_time["loss"] += t2 - t1
                    phase_time["backward_dbwd"] += t3 - t2

        out(_describe("training", train_path, batches))
        for _ in range(cfg["profile_warmup"]):
            step(False)
        synchronize(device)
        for _ in range(cfg["profile_repeat"]):
            step(True)
        total_phases = sum(phase_time.values())
        out("[phase-timer] training:")
        for name, t in phase_time.items():
            avg = t / cfg["profile_repeat"]
            out(f"  {name} {avg:.6f} s/run  {100 * t / max(total_phases, 1e-12):.1f}%")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        total = _time(lambda: step(False), 0, cfg["profile_repeat"], device)
        results["training"] = total / cfg["profile_repeat"]
        out(f"[timer] training fwd+bwd+dbwd: {total:.6f} s total, {results['training']:.6f} s/run")
        if device.type == "cuda":
            out(_host_gpu_line("training", lambda: step(False), cfg["profile_repeat"], device))
        _op_tables(lambda: step(False), "training", cfg, device, out)
        if device.type == "cuda":
            out(f"[cuda] peak allocated during training: {torch.cuda.max_memory_allocated(device) / 2**20:.1f} MiB")
    return results
