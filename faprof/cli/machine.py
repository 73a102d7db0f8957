"""`faprof list`, `doctor`, `build` and `dashboard`: what this machine and this faprof have, and the app."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from faprof.cli.group import console, fmt, main, say
from faprof.errors import FaprofError
from faprof.model.values import as_float


# -------------------------------------------------------------------------------- list
@main.command(name="list")
@click.argument("what", type=click.Choice(["all", "scenarios", "variants", "gpus"]), default="all")
@click.option("--hidden", is_flag=True, help="Also list test-only variants.")
def list_cmd(what: str, hidden: bool) -> None:
    """List scenarios, variants and known GPUs."""
    if what in ("all", "scenarios"):
        from faprof.model.scenarios import list_scenarios, load_scenario

        t = Table(title="scenarios", header_style="bold")
        for c in ("name", "problems", "baseline", "description"):
            t.add_column(c)
        for name in list_scenarios():
            try:
                s = load_scenario(name)
                t.add_row(name, str(len(s.problems)), s.baseline, s.description)
            except FaprofError as e:
                t.add_row(name, "", "", f"[red]invalid: {e}[/]")
        console.print(t)
    if what in ("all", "variants"):
        from faprof.variants import all_variants

        t = Table(title="variants", header_style="bold")
        for c in ("name", "kind", "device", "dtypes", "directions", "description"):
            t.add_column(c)
        for v in all_variants(include_hidden=hidden):
            t.add_row(v.name, v.kind, v.device, ",".join(v.dtypes), ",".join(v.directions), v.description)
        console.print(t)
    if what in ("all", "gpus"):
        from faprof.model import gpus

        df = gpus.as_dataframe()
        t = Table(title="GPUs (datasheet figures; dense tensor rates, fp32 accumulate)", header_style="bold")
        cols = [("name", "GPU"), ("cc", "CC"), ("sms", "SMs"), ("mem_bw_gbs", "GB/s"), ("l2_mb", "L2 MB"),
                ("fp32_tflops", "fp32"), ("fp16_tensor_tflops", "fp16 TC"), ("bf16_tensor_tflops", "bf16 TC")]
        for _, label in cols:
            t.add_column(label)
        for _, r in df.iterrows():
            t.add_row(*[fmt(r[c], "g") for c, _ in cols])
        console.print(t)


# ------------------------------------------------------------------------------ doctor
@main.command()
def doctor() -> None:
    """Check this machine: Python, torch and its CUDA, GPU, nvcc, ninja (and the Nsight tools)."""
    from faprof import doctor as doc

    checks = doc.run_checks()
    t = Table(title="faprof doctor", header_style="bold")
    for c in ("check", "status", "detail"):
        t.add_column(c)
    style = {"ok": "green", "warn": "yellow", "fail": "red", "info": "cyan"}
    for chk in checks:
        t.add_row(escape(chk.name), f"[{style[chk.status]}]{chk.status}[/]", escape(chk.detail))  # details quote pip extras
    console.print(t)
    for chk in checks:
        if chk.hint and chk.status in ("warn", "fail"):
            console.print(f"[{style[chk.status]}]{chk.name}[/]: {escape(chk.hint)}", soft_wrap=True)


# ------------------------------------------------------------------------------- build
@main.command()
@click.option("--arch", default="sm_80,sm_89,sm_90", show_default=True, help="Comma-separated archs to compile for with nvcc (no GPU needed).")
@click.option("--load", "do_load", is_flag=True, help="Instead: JIT-build (or load from the cache) the torch extension for the GPU present and print the time.")
@click.option("--verbose", is_flag=True, help="With --load: show torch's and ninja's build output (the compiler's messages).")
def build(arch: str, do_load: bool, verbose: bool) -> None:
    """Compile the kernels with nvcc and print ptxas' resource usage and the occupancy it implies.

    With --load, build the torch extension for this GPU instead: the first run compiles (cold),
    later runs in new processes reuse the cached build (warm) while sources and flags are unchanged.
    """
    from faprof.variants import build as b

    if do_load:
        info = b.load(verbose=verbose)
        say(f"extension: {info.summary()}")
        return
    archs = tuple(a.strip() for a in arch.split(",") if a.strip())
    if not archs:
        raise FaprofError(f"--arch {arch!r} names no architecture: give e.g. sm_80,sm_89,sm_90")
    for a in archs:
        b.require_kernel_arch(a)  # one line before any nvcc runs
    with console.status(f"compiling kernels/*.cu for {', '.join(archs)} (unchanged files come from the cache)"):
        from faprof.variants.ptxas import resource_report

        df = resource_report(archs=archs)
    console.print(build_table(df))
    compiled, pairs = df.attrs.get("compiled"), df.attrs.get("pairs")
    if pairs:
        say(f"{compiled} of {pairs} (file, arch) compiles ran; the rest reused ptxas output cached by source hash "
            f"under {b.cache_root() / 'ptxas'}" if compiled != pairs else f"compiled {pairs} (file, arch) pairs")
    spill = df["spill_store_bytes"].fillna(0).gt(0) | df["spill_load_bytes"].fillna(0).gt(0)
    if spill.any():
        say(f"{int(spill.sum())} kernel/arch pair(s) spill registers to local memory", style="yellow")


def build_table(df) -> Table:
    """ptxas' table for people: one row per kernel instantiation and arch, the template arguments
    in full in their own column (folded, never cut), shared memory in KiB, occupancy as a whole %."""
    t = Table(title="ptxas resource usage per kernel and arch, and the theoretical occupancy it implies "
                    "(namespaces dropped from names)", header_style="bold")
    t.add_column("file")
    t.add_column("kernel")
    t.add_column("template arguments", overflow="fold", min_width=16)
    for label in ("D", "arch", "threads", "regs", "smem KiB", "stack B", "spills B (st/ld)", "blocks/SM", "occupancy"):
        t.add_column(label, justify="right", no_wrap=True)
    t.add_column("limited by", no_wrap=True)
    prev = None
    for _, r in df.iterrows():
        smem = _num(r.get("smem_static_bytes")) + _num(r.get("dyn_smem_bytes"), 0.0)
        st, ld = _num(r.get("spill_store_bytes"), 0.0), _num(r.get("spill_load_bytes"), 0.0)
        occ = _num(r.get("occupancy_pct"))
        spills = "0" if st == 0 and ld == 0 else f"[yellow]{st:.0f}/{ld:.0f}[/]"
        same = prev is not None and (prev["file"], prev["name"]) == (r["file"], r["name"])
        t.add_row(
            "" if same else str(r["file"]), "" if same else _unqualified(r["name"]), _unqualified(r.get("template_args")),
            _int(r.get("D")), str(r["arch"]), _int(r.get("threads")),
            _int(r.get("registers")) + (f" ({r['role_registers']})" if isinstance(r.get("role_registers"), str) and r["role_registers"] else ""),
            "" if smem != smem else f"{smem / 1024:.1f}", _int(r.get("stack_frame_bytes")), spills,
            _int(r.get("blocks_per_sm")), "" if occ != occ else f"{occ:.0f}%", str(r.get("limiter") or ""),
        )
        prev = r
    return t


def _unqualified(name: Any) -> str:
    """'ns::Cfg<64, 128>, true' -> 'Cfg<64, 128>, true': every argument kept, namespaces dropped."""
    import re

    return re.sub(r"\b[A-Za-z_]\w*::", "", str(name or ""))


def _num(x: Any, default: float = float("nan")) -> float:
    v = as_float(x)
    return default if v != v else v


def _int(x: Any) -> str:
    v = _num(x)
    return "" if v != v else f"{v:.0f}"


# --------------------------------------------------------------------------- dashboard
@main.command()
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--port", type=int, help="Port for the Streamlit server (default: Streamlit's, 8501).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 127.0.0.1 keeps the dashboard on this machine (0.0.0.0: every interface).")
@click.option("--print-command", is_flag=True, help="Print the streamlit command instead of running it.")
def dashboard(runs: tuple[Path, ...], port: int | None, host: str, print_command: bool) -> None:
    """Open the Streamlit dashboard on run bundles (folders of runs, bundles; default: runs/).

    The examples under examples/runs/ are always loaded too; bundle archives can be uploaded in the page.
    """
    import importlib.util
    import os

    from faprof.analysis.load import APP_PATH

    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        raise FaprofError("the dashboard needs streamlit and plotly: pip install 'faprof[app]'")
    if not APP_PATH.is_file():
        raise FaprofError(f"the dashboard app is not at {APP_PATH}: reinstall faprof (its app is package data)")
    for r in runs:
        if not r.exists():
            raise FaprofError(f"{r} does not exist (give run bundles or folders of them)")
    argv = [sys.executable, "-m", "streamlit", "run", str(APP_PATH), "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal", "--server.maxUploadSize", "4096",  # MB: archives with raw reports
            "--server.address", host]
    if port:
        argv += ["--server.port", str(port)]
    argv += ["--", *[str(r.resolve()) for r in runs]]
    if print_command:
        say(shlex.join(argv))  # paste-able: a path with spaces stays one word
        return
    sys.stdout.flush()
    os.execv(sys.executable, argv)

