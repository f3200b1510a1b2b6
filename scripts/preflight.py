#!/usr/bin/env python3
"""Preflight checks for the full-scale speedrun: GPUs and their memory, the NVIDIA driver (and so which pinned GPU
stack to install), free disk, and the Python that builds the GPU environment.

Standard library only: it runs before any environment exists. Every check returns plain data, so the tests feed it
faked `nvidia-smi` output; the command line prints one line per check and exits 1 with the reasons when a check fails.

    python3 scripts/preflight.py                      # 4 GPUs with >= 40 GiB each, 150 GiB free here
    python3 scripts/preflight.py --gpus 8 --disk-path /data --min-disk-gib 300
    python3 scripts/preflight.py --pin-set            # prints cu12 or cu13 (used by scripts/setup_gpu.sh)
    python3 scripts/preflight.py --allow-no-gpu       # the dry run: check what a CPU machine can answer
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The GPU stacks in scripts/gpu/: PyPI's torch >= 2.11 and vLLM >= 0.20 are CUDA 13 builds (driver >= 580);
# the CUDA 12 set (torch 2.10, vLLM 0.19.1, built with CUDA 12.8/12.9) needs a CUDA 12 driver.
MIN_DRIVER_CU12 = (525, 60)  # CUDA 12.0's minimum; older 12.x drivers run 12.8 code through minor-version compatibility
RECOMMENDED_DRIVER_CU12 = 570  # CUDA 12.8, what torch 2.10 is built with (vLLM 0.19.1 was built with 12.9: R575)
MIN_DRIVER_CU13 = 580
PYTHON_SUPPORTED = ((3, 11), (3, 12))  # the Pythons the pinned sets were resolved for
# Rough needs of the default run (Qwen2.5-1.5B, HotpotQA, BEIR corpus): an estimate, see --help
DISK_NEEDS_GIB = {"GPU environment (.venv-gpu)": 15, "HotpotQA and the BEIR corpus": 3,
                  "embeddings and the flat index (bge-large, 5.2M passages)": 45, "model weights": 4,
                  "checkpoints (actor + critic, optimizer state, 2 kept) and merged weights": 70}
DEFAULT_MIN_DISK_GIB = 150
# What the host needs beyond the GPUs, per task (estimates, GiB of RAM): the retrieval service's flat index (21 GB) and
# its 5.2M passages; ALFWorld's game processes, one per episode in flight; Ray, the data loader and the trainer's
# CPU-side state in every case
HOST_RAM_GIB = {"search": 96, "gsm8k": 48, "alfworld": 96}
SHM_MIN_GIB = 8  # Ray's object store and NCCL live in /dev/shm; a container's default (64 MB) stops both
BUILD_TOOLS = {"search": ["gcc"], "gsm8k": ["gcc"], "alfworld": ["gcc", "g++", "make", "cmake"]}  # Triton; jericho


def checkpoint_gib(params_b: float, critic: bool, keep: int = 2) -> float:
    "Disk for the kept checkpoints: fp32 weights and Adam's two moments (12 bytes a parameter) and bf16 HF weights (2)."
    return keep * params_b * 14 * (2 if critic else 1)


class PreflightError(RuntimeError):
    "A check that cannot even run (no nvidia-smi, unreadable output): the message says what to do."


@dataclass
class Gpu:
    index: int
    name: str
    memory_mib: int
    driver_version: str

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024


@dataclass
class Report:
    ok: bool = True
    errors: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def fail(self, msg: str):
        self.ok = False
        self.errors.append(msg)


# ---------------------------------------------------------------- parsing nvidia-smi

GPU_QUERY = ["--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"]


def parse_gpus(csv_text: str) -> list[Gpu]:
    "Parse `nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader,nounits`."
    gpus = []
    for n, line in enumerate(csv_text.strip().splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            raise PreflightError(f"nvidia-smi line {n} has {len(parts)} fields, expected 4 "
                                 f"(index, name, memory.total, driver_version): {line!r}")
        idx, mem, drv = parts[0], parts[-2], parts[-1]
        name = ", ".join(parts[1:-2])  # a GPU name could hold a comma
        if not idx.isdigit() or not re.fullmatch(r"\d+(\.\d+)?", mem) or not re.fullmatch(r"\d+(\.\d+)*", drv):
            raise PreflightError(f"nvidia-smi line {n} is not index, name, memory in MiB, driver version: {line!r}")
        gpus.append(Gpu(int(idx), name, int(float(mem)), drv))
    return gpus


def parse_cuda_version(smi_text: str) -> str | None:
    "The highest CUDA version the driver supports, from the banner of plain `nvidia-smi` ('CUDA Version: 12.8')."
    m = re.search(r"CUDA Version:\s*([\d.]+)", smi_text)
    return m.group(1) if m else None


def driver_tuple(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(\.\d+)*", version or ""):
        raise PreflightError(f"cannot read the NVIDIA driver version {version!r}")
    return tuple(int(x) for x in version.split("."))


def pin_set(driver_version: str) -> str:
    "Which pinned GPU stack fits the driver: 'cu13' for R580+, 'cu12' for CUDA 12 drivers; an error below that."
    d = driver_tuple(driver_version)
    if d[0] >= MIN_DRIVER_CU13:
        return "cu13"
    if d[:2] >= MIN_DRIVER_CU12:
        return "cu12"
    raise PreflightError(f"NVIDIA driver {driver_version} is too old: the GPU stack needs a CUDA 12 driver "
                         f"(>= {MIN_DRIVER_CU12[0]}.{MIN_DRIVER_CU12[1]}; {RECOMMENDED_DRIVER_CU12}+ recommended) "
                         f"or a CUDA 13 one ({MIN_DRIVER_CU13}+). Update the driver and run again.")


def query_nvidia_smi(exe: str = "nvidia-smi", timeout: float = 30) -> tuple[list[Gpu], str | None]:
    "Ask nvidia-smi for the GPUs and the CUDA version; a PreflightError says why that failed."
    path = shutil.which(exe)
    if path is None:
        raise PreflightError(f"'{exe}' was not found: this machine has no NVIDIA driver (or it is not on PATH). "
                             "The full run needs NVIDIA GPUs; use --dry-run to check the rest, or --scale tiny.")
    try:
        q = subprocess.run([path, *GPU_QUERY], capture_output=True, text=True, timeout=timeout)
        banner = subprocess.run([path], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PreflightError(f"running {exe} failed ({e}); is the NVIDIA driver loaded?") from None
    if q.returncode != 0:
        msg = (q.stderr or q.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PreflightError(f"{exe} failed (exit {q.returncode}): {msg[0]}. Is the driver loaded and the GPU visible?")
    return parse_gpus(q.stdout), parse_cuda_version(banner.stdout)


# ---------------------------------------------------------------- checks


def check_gpus(gpus: list[Gpu], need: int, min_mem_gib: float, report: Report) -> None:
    report.info["gpus"] = [asdict(g) for g in gpus]
    if not gpus:
        report.fail("nvidia-smi lists no GPU")
        return
    if len(gpus) < need:
        report.fail(f"{len(gpus)} GPU(s) found, the run asks for {need} per node: pass --gpus {len(gpus)} "
                    "(and smaller batch sizes if needed), or run on a bigger machine")
    small = [g for g in gpus if g.memory_gib < min_mem_gib]
    if small:
        report.fail("GPU memory below the {:.0f} GiB this run needs: ".format(min_mem_gib)
                    + ", ".join(f"GPU {g.index} {g.name} ({g.memory_gib:.0f} GiB)" for g in small))
    if len({g.name for g in gpus}) > 1:
        report.warnings.append("the GPUs are not all the same model: " + ", ".join(sorted({g.name for g in gpus})))


def check_driver(gpus: list[Gpu], cuda_version: str | None, report: Report) -> str | None:
    if not gpus:
        return None
    drv = gpus[0].driver_version
    report.info["driver_version"], report.info["cuda_version"] = drv, cuda_version
    try:
        pins = pin_set(drv)
    except PreflightError as e:
        report.fail(str(e))
        return None
    report.info["pin_set"] = pins
    if pins == "cu12" and driver_tuple(drv)[0] < RECOMMENDED_DRIVER_CU12:
        report.warnings.append(f"driver {drv} is older than R{RECOMMENDED_DRIVER_CU12}: CUDA 12.8 code runs through "
                               "minor-version compatibility (no PTX JIT); update the driver if kernels fail to load")
    return pins


def check_disk(path: str | Path, need_gib: float, report: Report, key: str = "disk",
               what: str = "data, index, checkpoints") -> None:
    p = Path(path).expanduser()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the folder may not exist yet: measure the file system it will be on
    free = shutil.disk_usage(probe).free / 2**30
    report.info[key] = {"path": str(p), "free_gib": round(free, 1), "need_gib": round(need_gib, 1)}
    if free < need_gib:
        report.fail(f"{free:.0f} GiB free at {p}, the run needs about {need_gib:.0f} GiB there ({what}): "
                    "free space, or put them on a bigger disk (speedrun.sh --data-dir and --out; preflight.py "
                    "--disk-path)")


def _meminfo_gib(field_name: str, text: str | None = None) -> float:
    text = text if text is not None else Path("/proc/meminfo").read_text()
    for line in text.splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 2**20
    raise PreflightError(f"/proc/meminfo has no {field_name}")


def python_include(exe: str) -> Path:
    "Where `exe`'s C headers (Python.h) belong."
    out = subprocess.run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                         capture_output=True, text=True, timeout=30)
    return Path(out.stdout.strip())


def check_host(report: Report, task: str, critic: bool, out_path: str | Path, params_b: float, python_exe: str,
               probe: dict | None = None, ram_need_gib: float | None = None) -> None:
    """What a GPU run needs of the host besides GPUs, sized for the task and algorithm: RAM, /dev/shm, compilers and
    Python's headers, disk for the checkpoints under --out. `probe` replaces what is measured (tests)."""
    probe = probe or {}
    ram = probe["ram_gib"] if "ram_gib" in probe else _meminfo_gib("MemTotal")
    need = ram_need_gib or HOST_RAM_GIB[task]  # a smaller run (the smoke test) says what it needs
    report.info["ram"] = {"total_gib": round(ram, 1), "need_gib": need}
    if ram < need:
        report.fail(f"this machine has {ram:.0f} GiB of RAM; a {task} run needs about {need} GiB (see HOST_RAM_GIB "
                    "in scripts/preflight.py for what it holds): use a bigger host, or fewer rollout workers")
    shm = probe["shm_gib"] if "shm_gib" in probe else shutil.disk_usage("/dev/shm").total / 2**30
    report.info["shm_gib"] = round(shm, 2)
    if shm < SHM_MIN_GIB:
        report.fail(f"/dev/shm holds {shm:.2f} GiB; Ray's object store and NCCL need at least {SHM_MIN_GIB} GiB "
                    "(in a container: docker run --shm-size=16g)")
    which = probe.get("which", shutil.which)
    missing = [t for t in BUILD_TOOLS[task] if which(t) is None]
    if missing:
        why = "Triton compiles its helpers with gcc" + (", and ALFWorld builds jericho and fast-downward from source"
                                                         if task == "alfworld" else "")
        report.fail(f"missing build tools: {', '.join(missing)} ({why}): apt-get install build-essential cmake")
    include = Path(probe["include"]) if "include" in probe else python_include(python_exe)
    if not (include / "Python.h").exists():
        report.fail(f"no Python.h in {include} ({python_exe}'s headers; Triton compiles against them): install "
                    "the interpreter's dev package, e.g. apt-get install python3.12-dev")
    check_disk(out_path, checkpoint_gib(params_b, critic), report, key="out_disk",
               what=f"{'actor and critic ' if critic else ''}checkpoints, 2 kept, of a {params_b:g}B model")


def check_python(version: tuple[int, ...], report: Report, exe: str = "python3") -> None:
    v = tuple(version[:2])
    report.info["python"] = ".".join(map(str, version[:3]))
    if v not in PYTHON_SUPPORTED:
        ok = " or ".join(f"{a}.{b}" for a, b in PYTHON_SUPPORTED)
        report.fail(f"{exe} is Python {v[0]}.{v[1]}; the pinned GPU stack was resolved for Python {ok}. "
                    f"Install one and run again with PYTHON=/path/to/python3.12")


def python_version(exe: str) -> tuple[int, ...]:
    "The version of another interpreter (the one .venv-gpu will be built from)."
    if exe == sys.executable:
        return tuple(sys.version_info[:3])
    if shutil.which(exe) is None:
        raise PreflightError(f"Python interpreter '{exe}' was not found; point PYTHON at Python 3.11 or 3.12")
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True,
                             text=True, timeout=30).stdout.split()
        return tuple(int(x) for x in out)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        raise PreflightError(f"'{exe}' did not run as a Python interpreter") from None


def run_checks(n_gpus: int = 4, min_gpu_mem_gib: float = 40, disk_path: str | Path = ".",
               min_disk_gib: float = DEFAULT_MIN_DISK_GIB, python_exe: str | None = None,
               nvidia_smi: str = "nvidia-smi", allow_no_gpu: bool = False,
               smi: tuple[list[Gpu], str | None] | None = None, host: dict | None = None) -> Report:
    """All checks; `smi` injects (gpus, cuda_version) instead of running nvidia-smi (tests), `allow_no_gpu` is the dry
    run, `host` the keyword arguments of check_host (task, critic, out_path, params_b, probe) to check the host too."""
    report = Report()
    try:
        gpus, cuda = smi if smi is not None else query_nvidia_smi(nvidia_smi)
    except PreflightError as e:
        if allow_no_gpu:
            report.warnings.append(f"no GPU check: {e}")
            gpus, cuda = None, None
        else:
            report.fail(str(e))
            gpus, cuda = None, None
    if gpus is not None:
        check_gpus(gpus, n_gpus, min_gpu_mem_gib, report)
        check_driver(gpus, cuda, report)
    check_disk(disk_path, min_disk_gib, report)
    exe = python_exe or sys.executable
    try:
        check_python(python_version(exe), report, exe)
    except PreflightError as e:
        report.fail(str(e))
    if host is not None:
        try:
            check_host(report, python_exe=exe, **host)
        except (PreflightError, OSError, subprocess.TimeoutExpired) as e:
            report.fail(f"host check: {e}")
    return report


def format_report(report: Report) -> str:
    i = report.info
    lines = []
    if "gpus" in i:
        gpus = i["gpus"]
        kinds = sorted({"{} ({:.0f} GiB)".format(g["name"], g["memory_mib"] / 1024) for g in gpus})
        lines.append(f"GPUs: {len(gpus)}: " + ", ".join(kinds))
    if "driver_version" in i:
        lines.append(f"driver: {i['driver_version']} (CUDA {i.get('cuda_version') or '?'}) -> "
                     f"pin set {i.get('pin_set', 'none')}")
    if "disk" in i:
        lines.append(f"disk: {i['disk']['free_gib']} GiB free at {i['disk']['path']} (need ~{i['disk']['need_gib']:.0f})")
    if "python" in i:
        lines.append(f"python: {i['python']}")
    if "ram" in i:
        lines.append(f"host: {i['ram']['total_gib']} GiB RAM (need ~{i['ram']['need_gib']}), /dev/shm "
                     f"{i['shm_gib']} GiB (need {SHM_MIN_GIB})")
    if "out_disk" in i:
        d = i["out_disk"]
        lines.append(f"checkpoints: {d['free_gib']} GiB free at {d['path']} (need ~{d['need_gib']:.0f})")
    lines += [f"warning: {w}" for w in report.warnings]
    lines += [f"error: {e}" for e in report.errors]
    lines.append("preflight: ok" if report.ok else f"preflight: {len(report.errors)} problem(s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    need = ", ".join(f"{k} ~{v}" for k, v in DISK_NEEDS_GIB.items())
    ap = argparse.ArgumentParser(prog="scripts/preflight.py", description=__doc__.split("\n\n")[0],
                                 epilog=f"Disk estimate (GiB): {need}.")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per node the run will use (default 4)")
    ap.add_argument("--min-gpu-mem-gib", type=float, default=40, help="memory each GPU needs (default 40)")
    ap.add_argument("--disk-path", default=".", help="where data, index and checkpoints go (default .)")
    ap.add_argument("--min-disk-gib", type=float, default=DEFAULT_MIN_DISK_GIB,
                    help=f"free disk needed there (default {DEFAULT_MIN_DISK_GIB})")
    ap.add_argument("--python", dest="python_exe", default=os.environ.get("PYTHON") or None,
                    help="the interpreter .venv-gpu is built from (default $PYTHON, else this one)")
    ap.add_argument("--nvidia-smi", default="nvidia-smi", help=argparse.SUPPRESS)
    ap.add_argument("--allow-no-gpu", action="store_true", help="do not fail without GPUs (the dry run)")
    ap.add_argument("--pin-set", action="store_true", help="print cu12 or cu13 for this driver and exit")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    if args.gpus < 1:
        ap.error(f"--gpus must be at least 1, got {args.gpus}")
    if args.pin_set:
        try:
            gpus, _ = query_nvidia_smi(args.nvidia_smi)
            if not gpus:
                raise PreflightError("nvidia-smi lists no GPU")
            print(pin_set(gpus[0].driver_version))
            return 0
        except PreflightError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    report = run_checks(args.gpus, args.min_gpu_mem_gib, args.disk_path, args.min_disk_gib, args.python_exe,
                        args.nvidia_smi, args.allow_no_gpu)
    print(json.dumps(asdict(report), indent=1) if args.json else format_report(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
