"""``--p2p blocking`` where it cannot work is refused by the job's configuration, before any rank starts. On real
ranks: tests/multiproc/test_blocking_p2p.py; through rrfp run: tests/inproc/test_run_args.py."""

from __future__ import annotations

import re

import pytest

from hints.errors import UserError
from runtime.config import RunConfig

GPT = dict(workload="gpt", ranks=4, microbatches=6, policy="fixed", iters=2, seed=3, jitter=0.5)


@pytest.mark.parametrize("changes,message", [
    (dict(policy="ready", p2p="blocking"), "`p2p`: blocking applies to `policy` fixed only"),
    (dict(policy="fixed", p2p="eager"), "`p2p`: 'eager' is not one of async, blocking"),
    (dict(policy="fixed", p2p="blocking", tp=2), "`p2p`: blocking is built for pipeline (and `dp`) jobs"),
])
def test_bad_p2p_is_refused_before_any_rank_starts(changes, message):
    with pytest.raises(UserError, match=re.escape(message)):
        RunConfig(**{**GPT, **changes})
