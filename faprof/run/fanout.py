"""The Nsight stages on several GPUs: one ncu (or nsys) process per GPU, tables merged into one bundle.

`faprof profile --ncu --gpus 0,1` plans the session as on one GPU, splits the planned
(variant, shape) pairs into one part per GPU (by shape when there are enough shapes, else by
variant; balanced by the kernels each pair is expected to profile: `faprof.run.ncu_split`), and runs each part in its own process
(`python -m faprof.run.fanout PART.json`) with `CUDA_VISIBLE_DEVICES=<index>`: that process calls the
single-GPU entry point `faprof.nsight.ncu.run.collect` on a scratch bundle under
`raw/ncu.gpu<i>/` with the part's `--ncu-shapes`/`--ncu-variants`. When every part has returned,
the parts' tables are concatenated into the run's tables (kernel ids of later parts shifted past
the earlier ones, so ids stay unique per bundle), each part's report and log are kept as
`raw/ncu.gpu<i>.ncu-rep` / `raw/ncu.gpu<i>.log`, and the manifest's `ncu` entry holds the stage's
wall time, the summed kernel count and each part's own record (`parts`).

`faprof profile --nsys --gpus 0,1` splits the run's variants over the GPUs the same way, one nsys
capture each (`faprof.nsight.nsys.collect` on a scratch bundle under `raw/nsys.gpu<i>/`); the
parts' nsys_kernels / nsys_summary rows are concatenated and their raw files kept as
`raw/nsys.gpu<i>.*`. (Times in nsys_kernels are on each capture's own clock.)

Each part gets its own TMPDIR, so the tools' instances do not share temporary files, and each ncu
its own `TMPDIR/nsight-compute-lock` (ncu's lock between profiling processes;
`FAPROF_NCU_LOCK=shared` keeps one for all, for comparison). The ncu record's `fanout` says what
the parts did together (`faprof.run.ncu_split.concurrency`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import variants
from faprof.errors import FaprofError
from faprof.model import plan as run_plan
from faprof.model.options import NcuSelection, ProfileOptions
from faprof.model.scenarios import parse_scenario
from faprof.nsight import nsys
from faprof.nsight.ncu import run as ncu_run
from faprof.nsight.ncu import session_plan as ncu_plan
from faprof.nsight.ncu.command import NcuSettings
from faprof.nsight.ncu.run import TABLES
from faprof.run import ncu_split
from faprof.store import Bundle


def _part_options(options: Any, variants: list[str], shapes: list[str]) -> dict[str, Any]:
    return {
        "variants": options.variants, "user_variants": list(options.user_variants or []),
        "task_timeout_s": options.task_timeout_s,
        "ncu_select": {**dataclasses.asdict(options.ncu_select), "variants": variants, "shapes": shapes},
    }


@contextlib.contextmanager
def pinned(gpu: int | None) -> Iterator[None]:
    """The profiled processes this one starts see only GPU `gpu` (the one the run's timing used, e.g.
    `--gpus 1`), numbered in PCI order as NVML numbers it; nothing changes for None."""
    if gpu is None:
        yield
        return
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    os.environ.update(CUDA_VISIBLE_DEVICES=str(gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def collect_ncu(bundle: Any, scenario: Any, options: Any, ncu_set: str, progress: Any, cuda_ok: bool,
                gpus: Sequence[int]) -> None:
    """The ncu stage of a --gpus run: fanned out over `gpus`, or on one GPU when it cannot split."""

    def single() -> None:
        with pinned(gpus[0] if gpus else None):
            ncu_run.collect(bundle, scenario, options, ncu_set, progress, cuda_ok)

    if not cuda_ok or len(gpus) < 2:
        return single()
    try:
        mode = ncu_split.lock_mode()
    except FaprofError as e:
        progress("warning", {"message": f"{e}; using {ncu_split.DEFAULT_LOCK_MODE}"})
        mode = ncu_split.DEFAULT_LOCK_MODE
    try:
        settings = NcuSettings.resolve(options.ncu_select, scenario, ncu_set)
        gpu_name = (bundle.manifest().get("env") or {}).get("gpu_name")
        nplan = ncu_plan.plan_for(scenario, options, ncu_set, settings, gpu=gpu_name)
    except FaprofError:
        return single()  # the single-GPU stage records the same error the user would see there
    seen = ncu_plan.load_costs()["gpus"].get(gpu_name or "", {}).get("pairs", {})
    weights = ncu_split.pair_weights(nplan.pairs, nplan.calls, seen)
    parts = ncu_split.plan_parts(nplan.pairs, gpus, weights)
    if len(parts) < 2:
        return single()
    t0 = time.perf_counter()
    expected = ncu_split.expected_wall(parts, nplan.seconds_per_kernel, nplan.overhead_s)
    for line in ncu_split.plan_lines(parts, expected, mode, nplan.eta_source):
        progress("nsight", {"message": line, "tool": "ncu"})
    specs = [(p.gpu, {"tool": "ncu", "ncu_set": ncu_set, "options": _part_options(options, p.variants, p.shapes)})
             for p in parts]
    times: dict[int, list[float]] = {}
    done = _run_parts(bundle, "ncu", specs, progress, t0, {"set": ncu_set}, lock=mode, times=times)
    wall = time.perf_counter() - t0
    one_pace = nplan.seconds_per_kernel if nplan.eta_source.startswith("measured") else None
    conc = {"lock": mode, "split": [asdict(p) for p in parts],
            **ncu_split.concurrency(times, wall, expected, one_pace)}
    merge_parts(bundle, done, ncu_set, wall, progress, fanout=conc)


def collect_nsys(bundle: Any, scenario: Any, options: Any, progress: Any, cuda_ok: bool, gpus: Sequence[int]) -> None:
    """The nsys stage of a --gpus run: the run's variants split over `gpus`, one nsys capture each."""

    names = list(dict.fromkeys(v.name for _, v in run_plan.plan(scenario, options.variants)))
    if not cuda_ok or len(gpus) < 2 or len(names) < 2:
        with pinned(gpus[0] if gpus else None):
            return nsys.collect(bundle, scenario, options, progress, cuda_ok)
    n = min(len(gpus), len(names))
    groups = [names[i::n] for i in range(n)]
    t0 = time.perf_counter()
    progress("nsight", {"message": f"nsys: {len(names)} variant(s) split over GPUs {', '.join(str(g) for g in gpus[:n])}",
                        "tool": "nsys"})
    specs = [(gpu, {"tool": "nsys", "options": {"variants": vs, "user_variants": list(options.user_variants or [])}})
             for gpu, vs in zip(gpus, groups, strict=False)]
    done = _run_parts(bundle, "nsys", specs, progress, t0, {})
    merge_tool_parts(bundle, "nsys", done, time.perf_counter() - t0, progress)


def _run_parts(bundle: Any, tool: str, specs: Sequence[tuple[int, dict[str, Any]]], progress: Any, t0: float,
               record: dict[str, Any], lock: str = ncu_split.DEFAULT_LOCK_MODE,
               times: dict[int, list[float]] | None = None) -> list[tuple[int, Path]]:
    """Run one part process per GPU (scratch bundles under raw/<tool>.gpu<i>/) and wait for all of them.

    `lock`: 'per-gpu' gives each part its own TMPDIR (raw/<tool>.gpu<i>/tmp), 'shared' keeps this
    process's. `times`: filled with the seconds after `t0` at which each GPU's part reported a
    profiled kernel."""
    raw = bundle.raw_dir()
    manifest = {k: v for k, v in bundle.manifest().items() if k not in ("schema_version", "run_id", tool, "log")}
    meas = bundle.measurements()
    procs: list[tuple[int, Path, subprocess.Popen]] = []
    relays: list[threading.Thread] = []
    try:
        for gpu, spec in specs:
            part_dir = raw / f"{tool}.gpu{gpu}"
            shutil.rmtree(part_dir, ignore_errors=True)
            (part_dir / "tmp").mkdir(parents=True)
            # a scratch bundle: no schema_version/run_id, so find_bundles never lists it as a run
            (part_dir / "manifest.json").write_text(json.dumps({**manifest, "log": []}, default=str))
            if not meas.empty:
                meas.to_parquet(part_dir / "measurements.parquet", index=False)
            (part_dir / "part.json").write_text(json.dumps({**spec, "dir": str(part_dir)}))
            env = ncu_split.part_env(os.environ, gpu, str(part_dir / "tmp"), lock)
            p = subprocess.Popen([sys.executable, "-m", "faprof.run.fanout", str(part_dir / "part.json")], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
            procs.append((gpu, part_dir, p))
            seen = times.setdefault(gpu, []) if times is not None else []
            t = threading.Thread(target=_relay, args=(p, gpu, progress, t0, seen), daemon=True)
            t.start()
            relays.append(t)
        for _, _, p in procs:
            while p.poll() is None:
                time.sleep(0.2)
        for t in relays:
            t.join(5)
    except KeyboardInterrupt:
        for _, _, p in procs:
            _stop(p)
        msg = f"interrupted during {tool} (fanned out over GPUs); the timing rows are kept"
        bundle.log(f"{tool}: {msg}")
        bundle.update_manifest(**{tool: {**record, "status": "interrupted", "reason": msg,
                                         "wall_s": round(time.perf_counter() - t0, 3)}})
        raise
    return [(gpu, d) for gpu, d, _ in procs]


def _relay(p: subprocess.Popen, gpu: int, progress: Any, t0: float = 0.0, seen: list[float] | None = None) -> None:
    """Pass a part's progress lines on (prefixed with its GPU); note when it reports a profiled kernel."""
    assert p.stdout is not None
    for line in p.stdout:
        line = line.rstrip("\n")
        if line.startswith("FAPROF_PROGRESS "):
            try:
                msg = json.loads(line[len("FAPROF_PROGRESS "):])
                info = dict(msg.get("info") or {})
                if seen is not None and "kernels" in info:
                    seen.append(time.perf_counter() - t0)
                if "message" in info:
                    info["message"] = f"gpu{gpu}: {info['message']}"
                progress(msg.get("event", "nsight"), info)
                continue
            except (json.JSONDecodeError, AttributeError):
                pass
        if line.strip():
            progress("nsight", {"message": f"gpu{gpu}: {line}", "tool": "ncu"})


def _stop(p: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(p.pid, signal.SIGINT)
        p.wait(20)
    except (OSError, subprocess.TimeoutExpired):
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def merge_parts(bundle: Any, parts: Sequence[tuple[int, Path]], ncu_set: str, wall_s: float, progress: Any,
                fanout: dict[str, Any] | None = None) -> dict:
    """Concatenate the parts' ncu tables into the bundle, keep their reports and logs, record the stage
    (`fanout`: the split, lock mode and what the parts did together, kept as the record's `fanout`)."""

    records: list[dict[str, Any]] = []
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
    offset = 0
    for gpu, d in parts:
        sub = Bundle(d)
        try:
            rec = sub.manifest().get("ncu") or {"status": "failed", "reason": "the part wrote no record"}
        except FaprofError as e:
            rec = {"status": "failed", "reason": str(e)}
        top = 0
        for name in TABLES:
            df = sub.read(name) if sub.table_path(name).exists() else pd.DataFrame()
            if df.empty:
                continue
            df = df.copy()
            if "kernel_id" in df.columns:
                ids = pd.to_numeric(df["kernel_id"], errors="coerce")
                top = max(top, int(ids.max()) + 1 if ids.notna().any() else 0)
                df["kernel_id"] = ids.where(ids < 0, ids + offset).astype("int64")
            df["gpu_index"] = gpu
            frames[name].append(df)
        offset += top
        kept: dict[str, str] = {}
        for src, dst in (("raw/ncu.ncu-rep", f"ncu.gpu{gpu}.ncu-rep"), ("raw/ncu.log", f"ncu.gpu{gpu}.log"),
                         ("raw/ncu_plan.json", f"ncu_plan.gpu{gpu}.json")):
            if (d / src).exists():
                os.replace(d / src, bundle.raw_dir() / dst)
                kept[src] = f"raw/{dst}"
        records.append({"gpu_index": gpu, **{k: v for k, v in rec.items() if k not in ("command",)},
                        "report": kept.get("raw/ncu.ncu-rep"), "log": kept.get("raw/ncu.log")})
        for line in (sub.manifest().get("log") or []) if (d / "manifest.json").exists() else []:
            bundle.log(f"gpu{gpu}: {line.split(' ', 1)[-1]}")
        shutil.rmtree(d, ignore_errors=True)
    counts = {}
    for name, fs in frames.items():
        if fs:
            merged = pd.concat(fs, ignore_index=True)
            bundle.write(name, merged)
            counts[name] = len(merged)
    ok = [r for r in records if r.get("status") == "ok"]
    first = records[0] if records else {}
    record = {
        **{k: v for k, v in first.items() if k not in ("gpu_index", "report", "log", "tables", "kernels", "wall_s",
                                                      "status", "reason")},
        "status": "ok" if ok and len(ok) == len(records) else (first.get("status") if not ok else "partial"),
        "set": ncu_set, "wall_s": round(wall_s, 3), "gpus": [r["gpu_index"] for r in records],
        "kernels": sum(int(r.get("kernels") or 0) for r in records), "tables": counts, "parts": records,
        "rerun": f"faprof ncu {bundle.path} --set {ncu_set}",
    }
    if fanout:
        record["fanout"] = fanout
    bad = [r for r in records if r.get("status") != "ok"]
    if bad:
        record["reason"] = "; ".join(f"gpu{r['gpu_index']}: {r.get('status')}: {r.get('reason', '')}" for r in bad)
        progress("warning", {"message": f"ncu: {record['reason']}"})
    bundle.update_manifest(ncu=record)
    bundle.log(f"ncu: {record['kernels']} kernel(s) on {len(records)} GPU(s) in {wall_s:.1f} s; "
               + ", ".join(f"{k}={v} rows" for k, v in counts.items()))
    if fanout:
        line = ncu_split.summary_line(fanout, wall_s)
        bundle.log(line)
        progress("nsight", {"message": line, "tool": "ncu"})
    return record


def merge_tool_parts(bundle: Any, tool: str, parts: Sequence[tuple[int, Path]], wall_s: float,
                     progress: Any) -> dict[str, Any]:
    """The nsys parts: tables concatenated (run_id set to the run's), sqlite exports and logs kept
    as raw/nsys.gpu<i>.*, one manifest record with each part's own."""

    tables, ok_status = ("nsys_kernels", "nsys_summary"), "complete"
    records: list[dict[str, Any]] = []
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in tables}
    for gpu, d in parts:
        sub = Bundle(d)
        try:
            sm = sub.manifest()
        except FaprofError as e:
            sm = {tool: {"status": "failed", "reason": str(e)}}
        rec = sm.get(tool) or {"status": "failed", "reason": "the part wrote no record"}
        for name in tables:
            if sub.table_path(name).exists():
                df = sub.read(name)
                frames[name].append(df.assign(run_id=bundle.run_id, gpu_index=gpu) if not df.empty else df)
        kept = {}
        for f in sorted((d / "raw").glob(f"{tool}*")) if (d / "raw").is_dir() else []:
            dst = f"{tool}.gpu{gpu}{f.name[len(tool):]}"
            os.replace(f, bundle.raw_dir() / dst)
            kept[f.name] = f"raw/{dst}"
        for line in sm.get("log") or []:
            bundle.log(f"gpu{gpu}: {line.split(' ', 1)[-1]}")
        records.append({"gpu_index": gpu, **{k: v for k, v in rec.items() if k not in ("command", "command_line")},
                        "files": kept})
        shutil.rmtree(d, ignore_errors=True)
    counts = {}
    for name, fs in frames.items():
        fs = [f for f in fs if not f.empty]
        if fs:
            merged = pd.concat(fs, ignore_index=True)
            bundle.write(name, merged)
            counts[name] = len(merged)
    good = [r for r in records if r.get("status") == ok_status]
    record = {"status": ok_status if good and len(good) == len(records) else ("partial" if good else
                                                                          (records[0].get("status") if records else "failed")),
              "wall_s": round(wall_s, 3), "gpus": [r["gpu_index"] for r in records], "tables": counts, "parts": records}
    bad = [r for r in records if r.get("status") != ok_status]
    if bad:
        record["reason"] = "; ".join(f"gpu{r['gpu_index']}: {r.get('status')}: {r.get('reason', '')}" for r in bad)
        progress("warning", {"message": f"{tool}: {record['reason']}"})
    bundle.update_manifest(**{tool: record})
    bundle.log(f"{tool}: {len(records)} GPU(s) in {wall_s:.1f} s; " + ", ".join(f"{k}={v} rows" for k, v in counts.items()))
    return record


def _part_main(spec_path: str) -> int:
    """One GPU's part (run by `collect_ncu` with CUDA_VISIBLE_DEVICES set): the single-GPU stage."""

    spec = json.loads(Path(spec_path).read_text())
    sub = Bundle(Path(spec["dir"]))
    m = sub.manifest()
    for s in spec["options"].get("user_variants") or []:
        variants.load_user_variants(s)
    scenario = parse_scenario(m["scenario"]["raw"], f"{sub.path}/manifest.json scenario")

    def progress(event: str, info: dict[str, Any]) -> None:
        print("FAPROF_PROGRESS " + json.dumps({"event": event, "info": info}, default=str), flush=True)

    if spec.get("tool") == "nsys":

        nsys.collect(sub, scenario, ProfileOptions(**spec["options"]), progress, True)
        return 0
    sel = spec["options"]["ncu_select"]
    opts = ProfileOptions(**{**spec["options"], "ncu_select": NcuSelection(**{**sel, "metrics": tuple(sel["metrics"])})})
    ncu_run.collect(sub, scenario, opts, spec["ncu_set"], progress, True)
    return 0


if __name__ == "__main__":
    sys.exit(_part_main(sys.argv[1]))
