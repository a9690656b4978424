import pytest
from checkpoint_helpers import make_mlp, seed_everything


@pytest.fixture
def mlp():
    """A seeded tiny MLP, its AdamW optimizer and LambdaLR scheduler."""
    seed_everything(0)
    return make_mlp(0)
