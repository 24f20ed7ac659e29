"""scripts/corpus_gate.py, CI's pass/fail of a bench/fit_corpus.py run: a
run passes only with plain-step truth, no overshoot and found/true of at
least the ratio on every fit."""

import importlib.util
import os
import subprocess
import sys

from memfit.testing.corpus_log import PLAIN_TRUTH, REPLAY_TRUTH, format_failed, format_row

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = ("torch 2.14.1; 2 models, threads [1]; budget = the measured peak at B, prediction "
          "checked at 2B; true max: {truth}")


def _row(name, found, truth):
    return format_row(name, 1, dict(found=found, truth=truth, overshoot=found > truth, trials=7,
                                    affine=True, pred_err=0.005, cost=3.0, large=192), 12)


def _gate(tmp_path, rows, truth=PLAIN_TRUTH, capsys=None):
    """The gate's exit status and output on a log of `rows`: with capsys,
    its main() in this process (the script imports torch and memfit, which
    this process has: seconds saved per run); else the script as CI runs it."""
    log = tmp_path / "corpus.log"
    log.write_text("\n".join([HEADER.format(truth=truth)] + rows) + "\n")
    args = ["--min-models", "2", "--min-ratio", "0.98", str(log)]
    if capsys is not None:
        rc = _gate_module().main(args)
        out = capsys.readouterr()
        return rc, out.out + out.err
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "corpus_gate.py"), *args],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def _gate_module():
    spec = importlib.util.spec_from_file_location(
        "corpus_gate", os.path.join(ROOT, "scripts", "corpus_gate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_within_the_truth_passes(tmp_path, capsys):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 100, 100), _row("timm-vit", 99, 100)],
                    capsys=capsys)
    assert rc == 0, out


def test_one_overshoot_fails(tmp_path):
    # The script itself, as CI runs it: its exit status fails the job.
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 101, 100), _row("timm-vit", 100, 100)])
    assert rc == 1 and "tv-resnet18 (1 thr) overshoots" in out, out


def test_found_below_098_of_the_truth_fails(tmp_path, capsys):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 97, 100), _row("timm-vit", 100, 100)],
                    capsys=capsys)
    assert rc == 1 and "found/true 97/100 = 0.970 < 0.98" in out, out


def test_a_truth_that_is_memfits_own_replay_fails(tmp_path, capsys):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 100, 100), _row("timm-vit", 100, 100)],
                    truth=REPLAY_TRUTH, capsys=capsys)
    assert rc == 1 and "truth is not plain steps" in out, out


def test_a_model_that_failed_to_run_fails(tmp_path, capsys):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 100, 100), _row("timm-vit", 100, 100),
                               format_failed("tv-vgg11", 1, "RuntimeError: no kernel")],
                    capsys=capsys)
    assert rc == 1 and "tv-vgg11 (1 thr) failed: RuntimeError: no kernel" in out, out
