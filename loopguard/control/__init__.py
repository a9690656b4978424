"""Closed-loop controllers: decide the KL coefficient and when to roll back or stop.

Every controller is a frozen, validated config object with two pure methods: ``init(...)`` returns a state and
``update(state, measurement, ...)`` returns ``(output, new_state)``. States are frozen values: rolling back is
keeping an old one, checkpointing is ``state.to_dict()`` (plain JSON types) and ``State.from_dict(d)``.
Controllers never read the clock; time is the number of updates.

* :class:`BangBang` -- the ``kl_control`` mode: geometric raise while the hack vote is high, geometric
  relax back to the user's beta (never below it) after a run of healthy votes, hold in between.
* :class:`PIDLagrangian` -- the ``pid_lagrangian`` mode (Stooke et al. 2020): a PID multiplier on the hack
  score, added to the user's beta.
* :class:`AdaptiveKL` -- Ziegler et al.'s KL-targeting controller (what other libraries ship), for comparison.
* :class:`EscalationLadder` -- raise beta, then roll back, then stop; works with any of the above.

Example:
    >>> from loopguard.control import BangBang, EscalationLadder
    >>> ctl, ladder = BangBang(), EscalationLadder()
    >>> beta_state, ladder_state = ctl.init(0.04), ladder.init()
    >>> step, ladder_state = ladder.update(ladder_state, hacking=True)
    >>> out, beta_state = ctl.update(beta_state, 0.8, allow_lower=not step.in_cooldown)
    >>> step.action, out.direction
    ('raise_beta', 'hold')
"""

from __future__ import annotations

from loopguard.control._adaptive_kl import AdaptiveKL, AdaptiveKLState
from loopguard.control._bang_bang import BangBang, BangBangState
from loopguard.control._common import ControlOutput
from loopguard.control._ladder import EscalationLadder, LadderOutput, LadderState
from loopguard.control._pid_lagrangian import PIDLagrangian, PIDLagrangianState

__all__ = [
    "AdaptiveKL",
    "AdaptiveKLState",
    "BangBang",
    "BangBangState",
    "ControlOutput",
    "EscalationLadder",
    "LadderOutput",
    "LadderState",
    "PIDLagrangian",
    "PIDLagrangianState",
]
