"""The Hugging Face FitBatchSize with Seq2SeqTrainer(predict_with_generate=
True) and compute_metrics: each evaluation step runs model.generate (beams
and all) before the loss, and the eval batch set runs the Trainer's own
evaluation."""

import gc

import pytest
import torch

import memfit
from memfit._native import tracked_live_bytes

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, LENGTH, BUDGET = 256, 8, 4 << 20
pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(2, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


def t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def trainer(tmp_path, eval_batch, eval_samples, callbacks=()):
    args = transformers.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=4, max_steps=1, per_device_eval_batch_size=eval_batch,
        eval_accumulation_steps=1, predict_with_generate=True, generation_num_beams=4,
        generation_max_length=12)
    return transformers.Seq2SeqTrainer(model=t5(), args=args, train_dataset=Pairs(64),
                                       eval_dataset=Pairs(eval_samples),
                                       compute_metrics=lambda prediction: {"seen": 1.0},
                                       callbacks=list(callbacks))


def test_the_eval_batch_holds_the_generation_the_evaluation_runs(tmp_path):
    # Guards against what was: sized from the loss alone, the eval batch set ran out of memory
    # in the Trainer's generating evaluation (4 beams here).
    gc.collect()
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        fit = FitBatchSize()
        trainer(tmp_path, 256, 256, [fit])
    eval_batch = fit.plan.eval_batch_size
    assert 0 < eval_batch < 256
    fit = None
    gc.collect()
    # The truth: the Trainer's own loop, a step then its evaluation, generating.
    with memfit.simulated_device(BUDGET + tracked_live_bytes("cpu")):
        run = trainer(tmp_path, eval_batch, 2 * eval_batch)
        run.train()
        assert run.evaluate()["eval_seen"] == 1.0  # an OOM would raise
        run = None
