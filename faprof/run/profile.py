"""`faprof profile`: a scenario into a run bundle, on this machine or on a Dask cluster.

One `profile()` picks the backend (`faprof.run.local` or `faprof.run.cluster`), which measures the
rows; then one epilogue finishes the bundle for both: compact the rows, run the Nsight stages
(here, fanned out over `--gpus`; skipped on a cluster, whose reports would stay on its workers) and
mark the run complete. Ctrl-C or an error marks it interrupted or failed and keeps every finished
row (`faprof profile --resume RUN` completes it).
"""

from __future__ import annotations

import threading
from pathlib import Path

from faprof.model.options import ProfileOptions
from faprof.model.plan import alias_lines
from faprof.model.scenarios import Scenario
from faprof.nsight import ncu, nsys
from faprof.nsight.ncu.source_run import collect_source, source_mode
from faprof.run import cluster, fanout, local
from faprof.run.finish import now
from faprof.run.progress import Progress, noop
from faprof.run.resolve import RunSetup, setup
from faprof.run.state import RunState
from faprof.store import Bundle


def profile(scenario_spec: str | Path | Scenario, options: ProfileOptions | None = None,
            progress: Progress = noop, resume: str | Path | None = None) -> Bundle:
    """Run a scenario (or finish an interrupted run) and return its bundle.

    Args:
        scenario_spec: a scenario name, a .toml path or a parsed Scenario (ignored with `resume`).
        options: what to run and collect (`ProfileOptions`); `options.cluster` picks the Dask backend.
        progress: callback for the CLI's progress display.
        resume: an interrupted bundle to complete instead of starting a new one.
    """
    su = setup(scenario_spec, options, resume)
    state = RunState(progress=progress)
    for line in measures_lines(su):
        progress("plan", {"message": line})
    stop = threading.Event()
    try:
        if su.options.cluster:
            cluster.run_rows(su, state)
        else:
            local.run_rows(su, state, stop)
        bundle = state.bundle
        assert bundle is not None
        _epilogue(su, state, bundle)
        return bundle
    except KeyboardInterrupt:
        stop.set()
        if state.bundle is not None:
            state.bundle.compact()
            state.bundle.update_manifest(status="interrupted")
            state.bundle.log("interrupted by the user (Ctrl-C); finished rows are kept")
        raise
    except BaseException as e:
        stop.set()
        if state.bundle is not None:
            state.bundle.compact()
            state.bundle.update_manifest(status="failed")
            state.bundle.log(f"run stopped: {type(e).__name__}: {e}")
        raise


def measures_lines(su: RunSetup) -> list[str]:
    """What the run measures, printed first: the (variant, shape) pairs, and each declared alias
    timed once as its target (one kernel, one row)."""
    names = list(dict.fromkeys(v.name for _, v in su.pairs))
    lines = [f"measures {len(su.pairs)} (variant, shape) pair(s): {len(names)} variant(s) x "
             f"{len(su.scenario.problems)} shape(s)"]
    return lines + [f"  alias {line}" for line in alias_lines(su.scenario, su.options.variants)]


def _epilogue(su: RunSetup, state: RunState, bundle: Bundle) -> None:
    """Compact the rows, run the Nsight stages asked for, and mark the run complete."""
    bundle.compact()
    if state.timing_wall_s is not None:  # the timing stage's wall time (a resumed run adds a session)
        bundle.update_manifest(timing_wall_s=round(state.timing_wall_s, 3))
    ncu_on = bool(su.ncu_set and su.ncu_set != "none")
    if su.options.cluster:
        _skip_nsight_on_cluster(bundle, state, ncu_on, su.nsys_on)
    else:
        gpus = state.gpu_indices
        if ncu_on:
            assert su.ncu_set is not None
            if len(gpus) > 1:
                fanout.collect_ncu(bundle, su.scenario, su.options, su.ncu_set, state.progress, state.cuda_ok, gpus)
            else:
                ncu.collect(bundle, su.scenario, su.options, su.ncu_set, state.progress, state.cuda_ok)
            collect_source(bundle, su.scenario, su.options, source_mode(su.options, su.ncu_set), state.progress)
        if su.nsys_on:
            if len(gpus) > 1:
                fanout.collect_nsys(bundle, su.scenario, su.options, state.progress, state.cuda_ok, gpus)
            else:
                nsys.collect(bundle, su.scenario, su.options, state.progress, state.cuda_ok)
    bundle.update_manifest(status="complete", finished_utc=now(), worker_restarts=state.worker_restarts)


def _skip_nsight_on_cluster(bundle: Bundle, state: RunState, ncu_on: bool, nsys_on: bool) -> None:
    for stage, on in (("ncu", ncu_on), ("nsys", nsys_on)):
        if on:
            msg = (f"{stage}: skipped with --cluster (its report would stay on the worker); run `faprof {stage} "
                   f"{bundle.path}` on a GPU machine" if stage == "ncu" else
                   "nsys: skipped with --cluster (its report would stay on the worker)")
            bundle.log(msg)
            bundle.update_manifest(**{stage: {"status": "skipped", "reason": msg}})
            state.progress("warning", {"message": msg})
