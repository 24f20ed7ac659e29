"""A Trainer whose get_train_dataloader builds batches of its own: FitBatchSize
set per_device_train_batch_size from 64 to 16, the loader went on giving 64,
and the Trainer's loop ran out of memory at the first step. It now refuses
in one line naming the loader's batch, and the args are left as they were;
so does a get_eval_dataloader that evaluates at a batch that runs out.
The truth is the Trainer's own loop on the simulated device."""

import gc

import pytest
import torch

import memfit

transformers = pytest.importorskip("transformers")
from memfit.integrations.transformers import FitBatchSize  # noqa: E402
from test_integrations_transformers import BUDGET, Counting, Tokens, arguments, gpt2  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_and_collected")  # see conftest.py


class FixedLoader(Counting):
    """Batches of 64 whatever the arguments say."""

    def get_train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_dataset, batch_size=64,
                                           collate_fn=self.data_collator)


def trained(tmp_path, callbacks):
    gc.collect()
    with memfit.simulated_device(BUDGET):
        args = arguments(tmp_path, per_device_train_batch_size=64, max_steps=2)
        trainer = FixedLoader(model=gpt2(), args=args, train_dataset=Tokens(),
                              callbacks=callbacks)
        trainer.train()
    return args


def test_a_loader_with_a_batch_of_its_own_is_refused_in_one_line(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):  # the loop at the loader's 64
        trained(tmp_path, [])
    args = []
    with pytest.raises(ValueError) as error:
        gc.collect()
        with memfit.simulated_device(BUDGET):
            args.append(arguments(tmp_path, per_device_train_batch_size=64, max_steps=2))
            FixedLoader(model=gpt2(), args=args[0], train_dataset=Tokens(),
                        callbacks=[FitBatchSize()])
    said = str(error.value)
    assert "\n" not in said
    assert said.startswith("[FitBatchSize] get_train_dataloader builds batches of 64 with "
                           "per_device_train_batch_size set to "), said
    assert said.endswith(" fits") and "must batch by self._train_batch_size" in said
    assert args[0].per_device_train_batch_size == 64  # as it was
    assert args[0].gradient_accumulation_steps == 1


class FixedEvalLoader(Counting):
    """Evaluates in batches of 4096 whatever the arguments say."""

    def get_eval_dataloader(self, eval_dataset=None):
        return torch.utils.data.DataLoader(self.eval_dataset, batch_size=4096,
                                           collate_fn=self.data_collator)


def test_an_eval_loader_with_a_batch_of_its_own_is_refused_in_one_line(tmp_path):
    gc.collect()
    with memfit.simulated_device(BUDGET):
        args = arguments(tmp_path, per_device_train_batch_size=4, per_device_eval_batch_size=4096)
        trainer = FixedEvalLoader(model=gpt2(), args=args, train_dataset=Tokens(),
                                  eval_dataset=Tokens(4096))
        with pytest.raises(torch.OutOfMemoryError):  # the Trainer's evaluation at 4096
            trainer.evaluate()
        trainer = None
        with pytest.raises(ValueError) as error:
            FixedEvalLoader(model=gpt2(), args=args, train_dataset=Tokens(),
                            eval_dataset=Tokens(4096), callbacks=[FitBatchSize()])
    said = str(error.value)
    assert "\n" not in said
    assert said.startswith("[FitBatchSize] get_eval_dataloader builds batches of 4096 with "
                           "per_device_eval_batch_size set to "), said
    assert args.per_device_eval_batch_size == 4096  # as it was


def _two_views(samples):
    """Each sample twice, the second reversed: 2 rows a sample."""
    ids = torch.stack([torch.as_tensor(s["input_ids"]) for s in samples])
    ids = torch.cat([ids, ids.flip(-1)])
    return {"input_ids": ids, "labels": ids}


def _two_views_trained(tmp_path, per_device, accumulation, callbacks):
    gc.collect()
    with memfit.simulated_device(BUDGET):
        args = arguments(tmp_path, per_device_train_batch_size=per_device,
                         gradient_accumulation_steps=accumulation, max_steps=2)
        trainer = Counting(model=gpt2(), args=args, train_dataset=Tokens(),
                           data_collator=_two_views, callbacks=callbacks)
        trainer.train()
    return args, trainer.sizes


def test_a_collator_making_two_rows_a_sample_is_set_the_samples_whose_rows_fit(tmp_path):
    # See Note [A data collator that makes rows]: the rows that fit (16)
    # were set as per_device 16 x 4, batches of 32 rows, and the Trainer's
    # loop ran out of memory there.
    with pytest.raises(torch.OutOfMemoryError):
        _two_views_trained(tmp_path, 16, 4, [])
    args, sizes = _two_views_trained(tmp_path, 64, 1, [FitBatchSize()])
    rows = 2 * args.per_device_train_batch_size
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64
    assert set(sizes) == {rows}  # every micro-batch the loop ran
    assert args.per_device_train_batch_size < 16
