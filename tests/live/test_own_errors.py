"""A probe's ``fail`` must rest on sglang's code: an exception npudoctor's own code raised on the
way (a call that could not bind, a file it expected) is the check's ``error``, never sglang's
defect. (NPD003's probe once passed ``model_path`` twice to ``ServerArgs`` for a deployment given
as a launch command, and the TypeError was reported as a defect of sglang 0.5.20-0.5.23.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from npudoctor.engine.check import Probe
from npudoctor.errors import InputError
from npudoctor.live import locations, sealing
from npudoctor.results import Status


def failed_on(error: BaseException) -> Probe:
    """A probe that made ``error`` its evidence of a fail, as a live probe does."""
    return Probe(Status.FAIL, "sglang raised", (locations.exception_evidence("no exception", error),))


def test_an_exception_npudoctor_raised_is_its_own_error():
    from npudoctor.deployment.load import model_from_config_file

    with pytest.raises(InputError) as raised:
        model_from_config_file(Path("/nonexistent/config.json"))
    with sealing.watching(), pytest.raises(sealing.ProbeOwnError, match=r"npudoctor\.deployment\.load:\d+"):
        sealing.judged(failed_on(raised.value))


def test_an_exception_of_the_code_it_called_stays_its_fail():
    """Raised in the code the probe called (here the standard library's, as sglang's would be):
    the probe's ``fail`` stands."""
    import json

    with pytest.raises(ValueError) as raised:
        json.loads("{")
    assert sealing.raised_by_npudoctor(raised.value) is None
    with sealing.watching():
        assert sealing.judged(failed_on(raised.value)).status is Status.FAIL


def test_an_exception_a_kernel_reference_raised_answers_for_its_caller():
    """The CPU kernel references stand for the Ascend host (a package, one module per op family):
    a kernel rejecting its arguments is the caller's misuse, not npudoctor's own error."""
    import torch

    from npudoctor.live.npukernels.norm import npu_rms_norm

    with pytest.raises(ValueError) as raised:
        npu_rms_norm(torch.zeros(2, 4), torch.zeros(3))
    assert sealing.raised_by_npudoctor(raised.value) is None
