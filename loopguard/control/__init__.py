"""Closed-loop controllers: decide the KL coefficient and when to roll back or stop.

Every KL controller is a frozen, validated config object with two pure methods: ``init(base_beta)`` returns
a state and ``update(state, signal, *, allow_lower=True)`` returns ``(output, new_state)``, where ``signal``
is a :class:`ControlInput` (the hack vote, the measured KL, the batch size) and each controller reads what it
steers on. All three follow the :class:`KLController` protocol. States are frozen values (:class:`JSONState`):
rolling back is keeping an old one, checkpointing is ``state.to_dict()`` (plain JSON types) and
``State.from_dict(d)``. Controllers never read the clock; time is the number of updates.

* :class:`BangBang` -- the ``kl_control`` mode: geometric raise while the hack vote is high, geometric
  relax back to the user's beta (never below it) after a run of healthy votes, hold in between.
* :class:`PIDLagrangian` -- the ``pid_lagrangian`` mode (Stooke et al. 2020): a PID multiplier on the hack
  score, added to the user's beta.
* :class:`AdaptiveKL` -- Ziegler et al.'s KL-targeting controller (what other libraries ship), for comparison.
* :class:`EscalationLadder` -- raise beta, then roll back, then stop; works with any of the above.

Example:
    >>> from loopguard.control import BangBang, ControlInput, EscalationLadder
    >>> ctl, ladder = BangBang(), EscalationLadder()
    >>> beta_state, ladder_state = ctl.init(0.04), ladder.init()
    >>> step, ladder_state = ladder.update(ladder_state, hacking=True)
    >>> out, beta_state = ctl.update(beta_state, ControlInput(vote=0.8), allow_lower=not step.in_cooldown)
    >>> step.action, out.direction
    ('raise_beta', 'hold')
"""

from __future__ import annotations

from loopguard.control._adaptive_kl import AdaptiveKL, AdaptiveKLState
from loopguard.control._bang_bang import BangBang, BangBangState
from loopguard.control._common import ControlInput, ControlOutput, KLController
from loopguard.control._ladder import EscalationLadder, LadderOutput, LadderState
from loopguard.control._pid_lagrangian import PIDLagrangian, PIDLagrangianState
from loopguard.control._state import JSONState

__all__ = [
    "AdaptiveKL",
    "AdaptiveKLState",
    "BangBang",
    "BangBangState",
    "ControlInput",
    "ControlOutput",
    "EscalationLadder",
    "JSONState",
    "KLController",
    "LadderOutput",
    "LadderState",
    "PIDLagrangian",
    "PIDLagrangianState",
]
