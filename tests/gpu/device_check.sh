#!/usr/bin/env bash
# The GPU checks, as one script for a machine lent for a few minutes (one NVIDIA GPU, torch and
# NCCL installed, no network): install rankscope without its dependencies, run tests/gpu, the
# nccl overhead benchmark (inside the tests) and capture real nccl artifacts (tests/gpu/capture.py).
#
#     OUT=some/dir bash tests/gpu/device_check.sh
#
# Everything it writes lands under $OUT: device.txt, gpu_tests.log, runs.tar.gz (the tests' run
# directories), capture.tar.gz and capture.log.
set -u
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the folder for the results}"
PY=${PYTHON:-python3}
{
  nvidia-smi -L
  "$PY" -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name(0))"
  nproc
} >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
"$PY" -m pip install -q --no-deps --no-build-isolation --no-index . >"$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 1; }
"$PY" -c "import rankscope.probe._fast" && echo "probe C path: built"
tmp=$(mktemp -d)
timeout 300 "$PY" -m pytest tests/gpu -p no:cacheprovider -v -s --basetemp="$tmp/pytest" \
  >"$OUT/gpu_tests.log" 2>&1
echo "tests/gpu: exit $?"
grep -E "PASSED|FAILED|ERROR|SKIPPED|ratio|passed|failed" "$OUT/gpu_tests.log" | tail -30
tar -czf "$OUT/runs.tar.gz" -C "$tmp" pytest 2>/dev/null
timeout 150 "$PY" tests/gpu/capture.py "$tmp/capture" >"$OUT/capture.log" 2>&1
echo "capture: exit $?"
cat "$OUT/capture.log" "$tmp/capture/fr_read_cost.json" 2>/dev/null
tar -czf "$OUT/capture.tar.gz" -C "$tmp" capture
ls -la "$OUT"
