"""flashcart-md: configuration validation and short CPU runs through ASE and OpenMM."""

import re
import struct
from importlib import resources

import ase.io
import numpy as np
import pytest

from flashcart.cli.md import main
from flashcart.config import ConfigError
from flashcart.model.checkpoint import save_checkpoint
from flashcart.simulation.md import MD_SCHEMA, load_md_config, md_defaults

from .systems import tiny_water_model, water_box, water_cluster


def test_packaged_md_config_covers_the_schema_and_comments_every_key():
    assert set(md_defaults()) == set(MD_SCHEMA)
    for line in resources.files("flashcart.configs").joinpath("md.yaml").read_text().splitlines():
        m = re.match(r"^([a-z_0-9]+):", line)
        if m:
            assert "#" in line, f"md.yaml: key {m.group(1)} has no comment"


@pytest.mark.parametrize(
    "override, message",
    [
        ("stepz=5", r"unknown key 'stepz'; did you mean 'steps'"),
        ("engine=gromacs", "'engine' must be one of"),
        ("steps=0", "'steps' must be >= 1"),
        ("timestep=-1", "'timestep' must be > 0"),
        ("compile_mode=fast", "'compile_mode' must be one of"),
        ("headroom=-0.1", "'headroom' must be >= 0"),
        ("radial_table=-1", "'radial_table' must be >= 0"),
        ("trajectory=out.pdb", "must end in .extxyz, .xyz or .dcd"),
    ],
)
def test_bad_md_settings_are_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_md_config(overrides=["model=m", "structure=s.xyz", override])


def test_model_and_structure_are_required(tmp_path):
    with pytest.raises(ConfigError, match="needs 'model'"):
        load_md_config(overrides=["structure=s.xyz"])
    bad = tmp_path / "md.yaml"
    bad.write_text("model: m\nstructure: s.xyz\ntemprature: 300\n")
    with pytest.raises(ConfigError, match=r"md.yaml: unknown key 'temprature'; did you mean 'temperature'"):
        load_md_config(bad)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("md")
    save_checkpoint(tiny_water_model(), root / "best")
    ase.io.write(root / "cluster.extxyz", water_cluster())
    ase.io.write(root / "box.extxyz", water_box())
    return root


def test_ase_nve_writes_an_extxyz_trajectory_and_compares_with_the_profiler(files, capsys):
    out = files / "ase"
    cfg = files / "md.yaml"
    cfg.write_text(f"model: {files / 'best'}\nstructure: {files / 'cluster.extxyz'}\noutput_path: {out}\n")
    args = [
        str(cfg),
        "steps=6",
        "trajectory_interval=2",
        "log_interval=3",
        "device=cpu",
        "dtype=float64",
        "profile_repeat=2",
        "timestep=0.25",
    ]
    assert main([*args, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"step time: [0-9.]+ s/step", printed)
    assert re.search(r"profiler force call on the same structure and settings: [0-9.]+ s/run; MD step / profiler = [0-9.]+", printed)
    frames = ase.io.read(out / "trajectory.extxyz", index=":")
    assert len(frames) == 4  # steps 0, 2, 4, 6
    assert not np.allclose(frames[0].positions, frames[-1].positions)
    lines = (out / "md.log").read_text().splitlines()
    assert [int(line.split()[0]) for line in lines[1:]] == [0, 3, 6]
    etot = [float(line.split()[4]) for line in lines[1:]]
    assert max(etot) - min(etot) < 1e-3  # NVE
    assert not list(out.glob("*.part"))


def test_openmm_nvt_writes_a_dcd_trajectory(files, capsys):
    pytest.importorskip("openmm")
    out = files / "openmm"
    cfg = files / "md.yaml"
    cfg.write_text(f"model: {files / 'best'}\nstructure: {files / 'box.extxyz'}\noutput_path: {out}\n")
    args = ["engine=openmm", "ensemble=nvt", "trajectory=traj.dcd", "steps=4", "trajectory_interval=2", "log_interval=2"]
    assert main([str(cfg), *args, "device=cpu", "openmm_platform=Reference", "compare_profile=false", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "engine=openmm ensemble=nvt atoms=24" in printed and "profiler" not in printed
    data = (out / "traj.dcd").read_bytes()
    assert data[4:8] == b"CORD" and struct.unpack("<i", data[8:12])[0] == 3  # frames at steps 0, 2, 4
    lines = (out / "md.log").read_text().splitlines()
    assert [int(line.split()[0]) for line in lines[1:]] == [0, 2, 4]


def test_md_with_tabulated_radial_mlps_conserves_energy(files, capsys):
    """radial_table: the engine's radial MLPs as tables (NVE energy conserved, the tabulated
    forces being the tabulated energy's exact derivative); too few intervals name the key."""
    out = files / "tables"
    cfg = files / "tables.yaml"
    cfg.write_text(f"model: {files / 'best'}\nstructure: {files / 'cluster.extxyz'}\noutput_path: {out}\n")
    args = [str(cfg), "steps=6", "log_interval=3", "device=cpu", "dtype=float64", "compare_profile=false", "timestep=0.25"]
    assert main([*args, "radial_table=256", "--no-progress"]) == 0
    lines = (out / "md.log").read_text().splitlines()
    etot = [float(line.split()[4]) for line in lines[1:]]
    assert len(etot) == 3 and max(etot) - min(etot) < 1e-3
    capsys.readouterr()
    assert main([*args, "radial_table=8", "--no-progress"]) == 2
    assert "key 'radial_table' must be 0 (the radial MLPs) or at least 16" in capsys.readouterr().err


def test_cli_errors_are_one_line(files, capsys):
    cfg = files / "bad.yaml"
    cfg.write_text(f"model: {files / 'best'}\nstructure: {files / 'missing.extxyz'}\n")
    assert main([str(cfg), "--no-progress"]) == 2
    assert "flashcart-md: error: key 'structure': file" in capsys.readouterr().err
