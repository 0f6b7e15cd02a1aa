"""Device placement without a GPU: every command, and the demo, under `tests.host_guard`.

On a GPU, token ids built on the host crashed the first forward (``index is on cpu ... index_select``)
and `beliefscope demo` with it. The guard tags tensors made without the model's device as host and
reports any op that mixes them with the model's tensors, which is exactly where CUDA raises.
"""

import pytest
import torch

from .host_guard import HostDeviceMix, host_guard

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_guard_reports_host_ids_fed_to_the_hf_model_under_the_bridge(target):
    """The bug class itself: the HF model under the bridge, given host ids with no placement, is reported;
    through the bridge (which moves its inputs to the embedding's device) it is not."""
    from beliefscope.models.profile import hf_of

    bridge, _ = target
    ids = [[1, 2, 3]]
    hf = hf_of(bridge)
    hooks = dict(hf._forward_pre_hooks)
    hf._forward_pre_hooks.clear()  # the HF model without its input placement: the code before the fix
    try:
        with host_guard(), pytest.raises(HostDeviceMix, match="embedding"):
            hf(torch.tensor(ids))
    finally:
        hf._forward_pre_hooks.update(hooks)
    with host_guard():
        ref = bridge(torch.tensor(ids))  # placed: no mix
    assert torch.equal(ref, bridge(torch.tensor(ids)))


def test_the_guard_sees_numpy_of_a_device_tensor_and_allows_host_indices():
    w = torch.randn(4, 3)
    with host_guard():
        assert w[torch.tensor([0, 2])].shape == (2, 3)  # CUDA allows host index tensors
        assert float(w.sum() + torch.tensor(1.0)) == pytest.approx(float(w.sum()) + 1)  # and host scalars
        assert w.cpu().numpy().shape == (4, 3)
        with pytest.raises(HostDeviceMix, match="numpy"):
            w.numpy()
        with pytest.raises(HostDeviceMix, match="cat"):
            torch.cat([w, torch.zeros(1, 3)])


@pytest.mark.slow
def test_every_command_and_the_demo_place_their_tensors_on_the_model_device(tmp_path):
    """`make gpu-check`'s toy checks (the quick demo and every subcommand once), with every mix collected.

    It found: host token ids at every model entry (harvest, instrument, the view, steering, the Thinking
    States forward), the random-init twin left on the host, ``.numpy()`` of device tensors in forced
    answers, host-drawn random directions (causal check, steering), probes applied to device activations."""
    from beliefscope.gpu_check import GpuCheckConfig, run

    found: list[str] = []
    with host_guard(found):
        # not the split model: without a GPU it splits over the CPU and disk, so the CPU is its device
        report = run(GpuCheckConfig(device="cpu", out=str(tmp_path / "gpu_check.json"),
                                    smollm2_dir=str(tmp_path / "none"), skip="split_model"), say=lambda s: None)
    assert found == [], "\n".join(found)
    assert report["failed"] == [], report["failed"]
    assert report["checks"]["smollm2"]["ok"] is None  # skipped here: no SmolLM2 config in that folder
