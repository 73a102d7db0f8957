"""The run stage: options, worker processes, pools of GPUs, Dask clusters, and `profile()`: a scenario into a bundle.

`from faprof import run; run.profile("l4_causal", run.ProfileOptions(...))` is the library's way to
do what `faprof profile` does.
"""

from faprof.model.options import ProfileOptions
from faprof.run.profile import profile

__all__ = ["ProfileOptions", "profile"]
