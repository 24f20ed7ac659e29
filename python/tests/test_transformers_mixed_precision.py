"""The Hugging Face FitBatchSize with TrainingArguments(bf16=True): train()
has accelerate wrap the model's forward in autocast after the callback
planned, and the batch set is the one the Trainer's mixed-precision loop
runs. The model's forward is left as it was."""

import gc
import os
import subprocess
import sys

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LENGTH, BUDGET = 256, 8, 30 << 20
pool = torch.randint(2, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(0))
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, i):
        return {"input_ids": pool[i % 64], "labels": pool[i % 64]}


def wide_gpt2():
    # Wide and short: the weights' bf16 copies outweigh the activations.
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=LENGTH,
        attn_implementation="eager", bos_token_id=0, eos_token_id=1))


def arguments(tmp_path, batch, accumulation=1):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        max_steps=2, bf16=True)


@pytest.mark.slow
def test_the_batch_is_fitted_under_the_autocast_train_applies(tmp_path):
    # Guards against what was: fitted in float32, 4 x 16 was set (6 the largest), and the
    # Trainer's bf16 loop ran out of memory at 4 (2 runs). Accumulated, the gradients and
    # the optimizer state are alive beside the weights' bf16 copies in the forward.
    # In a fresh interpreter, as a user's script runs: after some other test files in one
    # worker the loop once ran out 0.5 MiB over the budget at the fitted batch (truth and
    # answer both 2 here); that order dependence is not explained yet.
    if os.environ.get("MEMFIT_FRESH_PROCESS") != "1":
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            f"{__file__}::test_the_batch_is_fitted_under_the_autocast_train_"
                            f"applies"], capture_output=True, text=True,
                           env=dict(os.environ, MEMFIT_FRESH_PROCESS="1",
                                    PYTHONPATH=os.pathsep.join(sys.path)))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        return
    gc.collect()
    args = arguments(tmp_path, 64)
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        model = wide_gpt2()
        transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                             callbacks=[FitBatchSize()])
        assert "forward" not in vars(model)  # accelerate wraps it in train(), not before
        model = None
    batch, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    assert batch * accumulation == 64 and accumulation > 1
    gc.collect()
    # The truth: the Trainer's own bf16 loop at that batch, on a device of the budget.
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        trainer = transformers.Trainer(model=wide_gpt2(), train_dataset=Tokens(),
                                       args=arguments(tmp_path, batch, accumulation))
        trainer.train()  # an OOM would raise
        assert trainer.state.global_step == 2
        trainer = None
