"""memfit.integrations' door: a third trainer's callback written with its
names alone sizes the batch as memfit.find_batch_size does for the same
step, and the two callbacks memfit ships reach memfit through it."""

import ast
import pathlib

import torch
import torch.nn.functional as F

import memfit
import memfit.integrations as door

INTEGRATIONS = pathlib.Path(memfit.__file__).parent / "integrations"


def test_the_shipped_callbacks_import_nothing_below_the_door():
    below = []
    for path in sorted(INTEGRATIONS.glob("lightning*.py")) + [INTEGRATIONS / "transformers.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if (node.level == 2 and module.startswith("_step")) \
                        or module.startswith("memfit._step"):
                    below.append(f"{path.name}:{node.lineno} {module}")
    assert below == []


def test_the_door_says_what_it_exports():
    assert set(door.__all__) == set(door.api.__all__)
    for name in door.__all__:
        assert not name.startswith("_") and getattr(door, name) is getattr(door.api, name)


class Engine:
    """A third trainer, in the shape of Ignite's: it calls
    process(engine, batch), which runs the model and returns the loss."""

    def __init__(self, model, process):
        self.model = model
        self.process = process


def test_a_third_trainer_sizes_its_batch_with_the_door_alone():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def process(engine, batch):
        x, y = batch
        return F.cross_entropy(engine.model(x), y)

    engine = Engine(model, process)
    loader_batch = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
    before = torch.get_rng_state()
    with door.kept_rng():
        example = door.example_of(loader_batch)
    assert torch.equal(torch.get_rng_state(), before)
    assert example[0].shape == (2, 64)

    # The trainer's step as memfit's: the engine's process on memfit's model.
    how = door.UserStep(step=lambda m, b: engine.process(Engine(m, process), b),
                        what="EngineFit")
    plan = door.plan_batch(model, example, optimizer, whole=door.LoopStep(how),
                           budget="4MiB", what="EngineFit")
    assert plan.batch_size > 2 and plan.batch_size == plan.max_batch
    assert plan.summary().startswith(f"memfit: batch {plan.batch_size} ")
    same = memfit.find_batch_size(model, example, optimizer=optimizer, budget="4MiB",
                                  step=lambda m, b: process(Engine(m, process), b))
    assert plan.max_batch == same.max_batch
