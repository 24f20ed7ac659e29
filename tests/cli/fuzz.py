"""CLI fuzz: every command with random and extreme values of its flags.
Whatever the input, memfit exits 0, 1 (bad input) or 2 (out of memory),
never by a signal, and an error is one line on stderr.

    fuzz.py MEMFIT_BINARY [RUNS] [SEED]

Sizes stay where a wrong answer fails fast: a model width that would
really allocate tens of GB is left out, huge batches are not (their inputs
fail to allocate at once)."""

import random
import subprocess
import sys

INTS = ["-1", "0", "1", "2", "3", "x", "1.5", "", "9223372036854775808", "-9223372036854775809"]
BATCHES = INTS + ["2000000000", "4", "7"]
SIZES = ["0", "1", "-1", "16MiB", "1.5GiB", "16000TiB", "16GB", "abc", "64MiB", "1TiB",
         "99999999999999999999", "8KiB"]
MODEL_SIZES = ["-1", "0", "1", "2", "x", "4", "16", "99999999999999999999"]
MODELS = ["mlp", "cnn", "gpt", "lstm", "resnet18", "nope", ""]
OPTIMIZERS = ["adam", "adam-offload", "momentum", "sgd", "none", "adagrad"]

COMMANDS = {
    "profile": {"model": MODELS, "batch": BATCHES, "optimizer": OPTIMIZERS,
                "mode": ["cpu", "meta", "gpu"], "target": ["cpu", "cuda", "tpu"],
                "iterations": ["0", "1", "2", "-3", "x"], "probes": ["4,8,16", "1", "0,0", "x,y", ""],
                "cuda-workspace": SIZES, "world-size": ["0", "1", "2", "-2", "x"],
                "bucket-cap": SIZES, "layers": MODEL_SIZES, "width": MODEL_SIZES,
                "heads": MODEL_SIZES, "context": MODEL_SIZES,
                "switches": ["json", "predict", "bucket-view"]},
    "fit": {"model": MODELS, "budget": SIZES, "optimizer": OPTIMIZERS, "mode": ["cpu", "meta", "x"],
            "margin": SIZES, "layers": MODEL_SIZES, "width": MODEL_SIZES, "heads": MODEL_SIZES,
            "context": MODEL_SIZES, "switches": ["json", "ddp"]},
    "train": {"model": MODELS, "batch": INTS + ["64"], "budget": SIZES, "steps": ["0", "1", "-1", "x"],
              "optimizer": OPTIMIZERS, "coupled": ["error", "allow", "x"], "plan": ["auto", "x"],
              "seed": INTS, "layers": MODEL_SIZES, "width": MODEL_SIZES, "heads": MODEL_SIZES,
              "context": MODEL_SIZES, "switches": ["json", "no-split", "allow-approximate"]},
    "advise": {"model": ["mlp", "gpt", "nope"], "batch": ["-1", "0", "1", "2", "x"],
               "budget": SIZES, "optimizer": OPTIMIZERS, "repeats": ["0", "1", "-1", "x"],
               "layers": ["1", "0", "x"], "width": ["16", "0", "x"], "heads": ["1", "2", "0"],
               "context": ["4", "0"], "switches": ["json", "allow-approximate"]},
}


# Inputs that once aborted or answered wrongly, tried first.
KNOWN = [
    ["profile", "--model", "gpt", "--batch", "2", "--width", "0"],
    ["profile", "--model", "gpt", "--batch", "2", "--heads", "0"],
    ["fit", "--model", "mlp", "--budget", "16000TiB"],
    ["fit", "--model", "gpt", "--budget", "64MiB", "--context", "0"],
    ["profile", "--model", "mlp", "--batch", "2000000000", "--mode", "meta"],
    ["profile", "--model", "gpt", "--batch", "2", "--layers", "-1"],
    ["profile", "--model", "mlp", "--batch", "8", "--world-size", "2", "--bucket-cap", "0"],
    ["fit", "--model", "mlp", "--budget", "16MiB", "--margin", "32MiB"],
    ["train", "--model", "mlp", "--batch", "4096", "--budget", "16MiB", "--steps", "1"],
    ["profile", "--model", "mlp", "--batch=4"],
    ["profile", "--model", "mlp", "--help"],
]


def case(rng):
    command = rng.choice(["profile", "profile", "fit", "fit", "train", "advise", "bogus"])
    if command == "bogus":
        return ["bogus", "--model", "mlp"]
    flags = COMMANDS[command]
    args = [command]
    for name, values in flags.items():
        if name == "switches":
            args += ["--" + s for s in values if rng.random() < 0.3]
        elif name in ("model",) or rng.random() < 0.35:
            value = rng.choice(values)
            args += [f"--{name}={value}"] if rng.random() < 0.2 else [f"--{name}", value]
    if command == "advise":  # keep it to one timed repeat: advise profiles many steps
        args += ["--repeats", "1"] if "--repeats" not in args else []
    if rng.random() < 0.05:
        args.append("--unknown-flag")
    return args


def main():
    binary = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 120
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 13)
    failures = []
    cases = KNOWN + [case(rng) for _ in range(runs)]
    for args in cases:
        try:
            r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            failures.append((args, "timed out after 300 s", ""))
            continue
        err = r.stderr.strip().splitlines()
        if r.returncode < 0:
            failures.append((args, f"killed by signal {-r.returncode}", r.stderr[-300:]))
        elif r.returncode not in (0, 1, 2):
            failures.append((args, f"exit status {r.returncode}", r.stderr[-300:]))
        elif r.returncode != 0 and len(err) != 1:
            failures.append((args, f"exit {r.returncode} with {len(err)} stderr lines", r.stderr[-300:]))
    for args, what, tail in failures:
        print(f"FAIL memfit {' '.join(args)}: {what}\n  {tail}")
    print(f"{len(cases) - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
