"""A simulated plant for closed-loop tests: hack pressure that grows while beta sits at the user's value."""

import math

import numpy as np
import pytest

from loopguard.control import ControlInput


def simulate_plant(
    controller, base_beta, *, steps=400, drift=0.02, c=0.05, noise=0.01, seed=0, drift_until=None
):
    """Run ``controller`` against a hack-pressure plant and return (scores, betas) as arrays.

    h_{t+1} = clip(h_t + drift_t - c * log(beta_t / beta_0) + N(0, noise^2), 0, 1), h_0 = 0.05; the controller
    sees h_t as its vote/score and its beta acts on the next step. ``drift_t`` is ``drift`` while
    ``t < drift_until`` (always when None) and -0.01 afterwards (the hack stops paying).
    """
    rng = np.random.default_rng(seed)
    state = controller.init(base_beta)
    pressure = 0.05
    scores, betas = [], []
    for t in range(steps):
        output, state = controller.update(state, ControlInput(vote=pressure))
        scores.append(pressure)
        betas.append(output.beta)
        push = drift if drift_until is None or t < drift_until else -0.01
        pressure = pressure + push - c * math.log(output.beta / base_beta) + rng.normal(0.0, noise)
        pressure = float(min(1.0, max(0.0, pressure)))
    return np.array(scores), np.array(betas)


@pytest.fixture
def plant():
    return simulate_plant
