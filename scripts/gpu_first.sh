#!/usr/bin/env bash
# First look at the GPU machine: environment, the spine on the GPU (smoke + l4_causal with the torch
# baselines), and raw ncu / nsys captures of the profiled-process target for parser fixtures.
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/dw && for f in .device/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
mkdir -p $OUT/fx
{ nvidia-smi; python3 -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda)"; ncu --version; $NSYS --version; python3 -c "import nvtx" 2>&1; ls /opt/nvidia/nsight-compute/2025.3.1/extras/python/; } > $OUT/env.txt 2>&1
TORCHV="torch_standard,sdpa_auto,sdpa_flash,sdpa_cudnn,sdpa_efficient,sdpa_math"
python3 -m faprof profile --scenario smoke --variants cpu_ref,$TORCHV --out $OUT/runs 2>&1 | tail -40
python3 -m faprof profile --scenario l4_causal --variants cpu_ref,$TORCHV --out $OUT/runs 2>&1 | tee $OUT/l4_table.txt | tail -60
# raw Nsight captures of the target (fixtures for the parsers)
timeout 300 ncu --set full --nvtx --nvtx-exclude faprof_warmup/ --cache-control all --clock-control none --import-source yes \
  -o $OUT/fx/smoke_full python3 -m faprof.nsight.target --scenario smoke --tool ncu --variants torch_standard,sdpa_flash,sdpa_efficient \
  --shapes b1_h2_sq128_sk128_d64_fp16_causal_fwd,b1_h2_sq64_sk64_d32_fp32_full_fwd --plan-out $OUT/fx/plan_ncu_full.json > $OUT/fx/ncu_full.log 2>&1; echo "ncu full rc=$?"
timeout 200 ncu --set basic --nvtx --nvtx-exclude faprof_warmup/ --cache-control all --clock-control none \
  -o $OUT/fx/smoke_basic python3 -m faprof.nsight.target --scenario smoke --tool ncu --variants torch_standard,sdpa_flash \
  --plan-out $OUT/fx/plan_ncu_basic.json > $OUT/fx/ncu_basic.log 2>&1; echo "ncu basic rc=$?"
timeout 200 $NSYS profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi -o $OUT/fx/smoke_nsys \
  python3 -m faprof.nsight.target --scenario smoke --tool nsys --iters 3 --variants torch_standard,sdpa_flash,sdpa_math \
  --plan-out $OUT/fx/plan_nsys.json > $OUT/fx/nsys.log 2>&1; echo "nsys rc=$?"
timeout 120 $NSYS export --type sqlite -o $OUT/fx/smoke_nsys.sqlite $OUT/fx/smoke_nsys.nsys-rep >> $OUT/fx/nsys.log 2>&1; echo "export rc=$?"
ls -la $OUT/fx
(cd $OUT && tar czf runs.tgz runs && rm -rf runs && tar czf fx.tgz fx && rm -rf fx)
cat $OUT/env.txt | head -30
