"""flashcart-profile on the CPU: phases, options and the published output lines."""

import re
from pathlib import Path

import pytest
import torch

from flashcart.cli.main import profile_main
from flashcart.testing import TINY_MODEL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    lines = (ROOT / "examples" / "ethanol" / "train.extxyz").read_text().splitlines(True)
    (tmp / "data.xyz").write_text("".join(lines[: 11 * 6]))
    return tmp


def run(data, capsys, *extra):
    model = [f"{k}={v}" for k, v in TINY_MODEL.items()]
    cfg = data / "profile.yaml"
    cfg.write_text(f"train_path: {data / 'data.xyz'}\ndevice: cpu\n")
    code = profile_main([str(cfg), *model, "profile_batch_size=2", "profile_n_batches=2", "profile_row_limit=5", "--no-progress", *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def parse_timer(out, label):
    m = re.search(rf"\[timer\] {label}: ([0-9.]+) s total, ([0-9.]+) s/run", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def test_both_phases_print_the_published_lines(data, capsys):
    out = run(data, capsys, "profile_repeat=2", "profile_warmup=1")
    assert re.search(r"\[model\] parameters=\d+", out) and "use_triton=" in out and "kernel_l_max=" in out
    m = re.search(r"\[inference\] data=(\S+) batches=(\d+), structures=(\d+), atoms=(\d+), edges=(\d+)", out)
    assert m and m.group(2) == "2" and m.group(3) == "4" and m.group(4) == "36"
    total, per = parse_timer(out, "inference fwd\\+bwd")
    assert per == pytest.approx(total / 2, rel=1e-3)
    assert re.search(r"\[training\] data=\S+ batches=2, structures=4, atoms=36, edges=\d+", out)
    block = out.split("[phase-timer] training:\n")[1].splitlines()[:3]
    shares = []
    for line, name in zip(block, ("predict_create_graph", "loss", "backward_dbwd")):
        m = re.match(rf"  {name} ([0-9.]+) s/run  ([0-9.]+)%", line)
        assert m, line
        shares.append(float(m.group(2)))
    assert sum(shares) == pytest.approx(100, abs=0.5)
    parse_timer(out, "training fwd\\+bwd\\+dbwd")
    assert "FlashCart and Triton operations" in out and "flashcart::tensor_product" in out
    assert "include profiler overhead" in out


@pytest.mark.parametrize("phase", ["inference", "training"])
def test_single_phase(data, capsys, phase):
    out = run(data, capsys, f"profile_phase={phase}")
    assert (f"[{phase}]" in out) and (("[training]" in out) == (phase == "training"))


def test_options_dynamic_batching_traces_and_recording(data, capsys, tmp_path):
    out = run(
        data,
        capsys,
        "profile_dynamic_batching=true",
        "profile_pre_fit=false",
        f"profile_trace_dir={tmp_path}",
        "profile_record_shapes=true",
        "profile_with_stack=true",
        "profile_memory=true",
        "profile_train_batch_size=3",
    )
    for phase in ("inference", "training"):
        path = tmp_path / f"{phase}.json"
        assert f"[trace] wrote {path}" in out and path.stat().st_size > 0
    assert re.search(r"\[training\] data=\S+ batches=2, structures=6", out)


def test_radial_tables_in_the_inference_phase_only(data, capsys):
    """profile_radial_table: the inference phase reads tabulated radial MLPs; the training phase
    evaluates the MLPs again (with the tables still in place it would refuse); too few
    intervals are an error naming the key."""
    out = run(data, capsys, "profile_radial_table=256")
    assert "radial_table=256" in out
    parse_timer(out, "inference fwd\\+bwd")
    parse_timer(out, "training fwd\\+bwd\\+dbwd")
    model = [f"{k}={v}" for k, v in TINY_MODEL.items()]
    assert profile_main([str(data / "profile.yaml"), *model, "profile_radial_table=8", "--no-progress"]) == 2
    assert "profile_radial_table must be 0 (the radial MLPs) or at least 16" in capsys.readouterr().err


def test_missing_data_is_a_clear_error(data, capsys):
    cfg = data / "empty.yaml"
    cfg.write_text("device: cpu\n")
    assert profile_main([str(cfg)]) == 2
    assert "needs 'profile_data_path' or 'train_path'" in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_prediction(data, capsys):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    out = run(
        data,
        capsys,
        "profile_compile_predict=true",
        "profile_phase=inference",
        "n_interactions=1",
        "correlation=2",
        "l_max_hidden_feats=1",
        "l_max_edge_attrs=1",
    )
    assert "compile=True" in out
    parse_timer(out, "inference fwd\\+bwd")
    # dynamo captured the prediction as a graph (without graph breaks) and AOT autograd compiled it
    assert counters["stats"]["unique_graphs"] >= 1 and counters["aot_autograd"]["ok"] >= 1, dict(counters)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_host_gpu_split_is_for_cuda_calls(data, capsys):
    """``host_and_gpu_time`` refuses a CPU device by name, and CPU runs print no ``[host-gpu]`` line."""
    from flashcart.profiling import host_and_gpu_time

    with pytest.raises(ValueError, match="CUDA calls, got device cpu"):
        host_and_gpu_time(lambda: None, 2, "cpu")
    assert "[host-gpu]" not in run(data, capsys, "profile_phase=inference", "profile_repeat=1", "profile_warmup=0")


@pytest.mark.gpu
def test_host_gpu_split_on_cuda():
    """On CUDA: a call whose GPU work outlasts its issue reads as GPU time (the GPU-alone time of
    a chain of large products exceeds its issue time), and a call that synchronises inside has no
    GPU-alone time (``None``)."""
    from flashcart.profiling import host_and_gpu_time

    a = torch.randn(4096, 4096, device="cuda")

    def products():
        b = a
        for _ in range(8):
            b = b @ a
        b.sum()

    host, gpu = host_and_gpu_time(products, 5, "cuda")
    assert host > 0 and gpu is not None and gpu > host

    def synchronising():
        products()
        torch.cuda.synchronize()

    host, gpu = host_and_gpu_time(synchronising, 3, "cuda")
    assert host > 0 and gpu is None
