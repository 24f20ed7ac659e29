"""scripts/corpus_gate.py, CI's pass/fail of a bench/fit_corpus.py run: a
run passes only with plain-step truth, no overshoot and found/true of at
least the ratio on every fit."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = ("torch 2.14.1; 2 models, threads [1]; budget = the measured peak at B, prediction "
          "checked at 2B; true max: {truth}")
PLAIN = "plain steps on memfit.simulated_device(budget), no recorder"
REPLAY = "memfit own allocator replay (memfit measuring itself: no card here)"


def _row(name, found, truth):
    over = "YES" if found > truth else "no"
    return (f"{name:<30} {1:>3} {found:>6} {truth:>6} {found / truth:>6.3f} {over:>4} "
            f"{7:>6} {'True':>6} {0.5:>+8.2f}% {3.0:>5.1f}x {96:>4} {12:>5}")


def _gate(tmp_path, rows, truth=PLAIN):
    log = tmp_path / "corpus.log"
    log.write_text("\n".join([HEADER.format(truth=truth)] + rows) + "\n")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "corpus_gate.py"),
                           "--min-models", "2", "--min-ratio", "0.98", str(log)],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_a_run_within_the_truth_passes(tmp_path):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 100, 100), _row("timm-vit", 99, 100)])
    assert rc == 0, out


def test_one_overshoot_fails(tmp_path):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 101, 100), _row("timm-vit", 100, 100)])
    assert rc == 1 and "tv-resnet18 (1 thr) overshoots" in out, out


def test_found_below_098_of_the_truth_fails(tmp_path):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 97, 100), _row("timm-vit", 100, 100)])
    assert rc == 1 and "found/true 97/100 = 0.970 < 0.98" in out, out


def test_a_truth_that_is_memfits_own_replay_fails(tmp_path):
    rc, out = _gate(tmp_path, [_row("tv-resnet18", 100, 100), _row("timm-vit", 100, 100)],
                    truth=REPLAY)
    assert rc == 1 and "truth is not plain steps" in out, out
