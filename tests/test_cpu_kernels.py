"""The numerically sensitive tests under every CPU kernel set this machine can run.

ATen picks one set of vectorised kernels per process (``ATEN_CPU_CAPABILITY``: default, avx2, avx512),
and each sums in its own order. A tolerance fitted to one set fails on a CPU that picks another: the
streamed probe fit failed on AVX-512 Xeons while it passed on the AMD machines it was written on. The
rest of the suite runs under this machine's own set; this file runs the tests whose claims are numeric
(probe fits against scikit-learn and each other, cached against uncached forwards, the cache against
HF's, invariant attention) under each of the others, in a fresh process each, so that a CPU we do not
have cannot surprise CI.
"""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMERIC = ["tests/test_probes_linear.py", "tests/test_probes_estimator.py", "tests/test_cache_core.py",
           "tests/test_forward.py", "tests/test_invariant_attention.py", "tests/test_cache_generate.py"]
ORDER = ["DEFAULT", "AVX2", "AVX512"]  # what torch.backends.cpu.get_cpu_capability() names, weakest first


def other_kernel_sets() -> list[str]:
    """The kernel sets below this process's own (ATen runs any set up to the CPU's best)."""
    own = torch.backends.cpu.get_cpu_capability()
    if own not in ORDER:  # an ARM or other build: its own set is the only one
        return []
    return [c.lower() for c in ORDER[: ORDER.index(own)]]


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_numeric_tests_hold_under_kernel_set(capability):
    if capability not in other_kernel_sets():
        pytest.skip(f"this CPU's own kernels are {torch.backends.cpu.get_cpu_capability()}: the suite runs them")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *NUMERIC],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    # the child must really run under the asked set, not silently fall back to another
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == capability.upper(), probe.stdout
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
