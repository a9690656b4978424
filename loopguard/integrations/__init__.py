"""Drop-ins for RL engines loopguard has no callback for (verl, OpenRLHF, older TRL PPO loops).

* :class:`GuardedKLController` -- the KL-controller interface those engines call (``.value`` and
  ``.update(current_kl, n_steps)``), driven by a loopguard :class:`~loopguard.Guard` fed through
  ``.observe(...)``.

Example:
    >>> from loopguard.integrations import GuardedKLController
    >>> GuardedKLController(init_kl_coef=0.05).value
    0.05
"""

from __future__ import annotations

from loopguard.integrations.kl_controller import GuardedKLController

__all__ = ["GuardedKLController"]
