"""refusals.py MEMFIT: a flag out of range is refused when the command reads
it, before anything runs: exit 1 and one line on stderr that starts with the
command and names the flag, with no library operation prefix ("[fit] ...")
after it (Note [One line, one prefix], src/cli/args.h)."""
import subprocess
import sys

memfit = sys.argv[1]


def refused(args, starts):
    done = subprocess.run([memfit] + args, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, (args, done.returncode, done.stderr)
    assert len(lines) == 1, (args, done.stderr)
    assert lines[0].startswith(starts), (args, lines[0])
    assert "[" not in lines[0].split(": ", 1)[1], (args, lines[0])
    assert done.stdout == "", (args, done.stdout)


for command in ["profile", "fit", "train", "advise"]:
    refused([command, "--model", "mlp", "--budget", "0"],
            f"memfit {command}: --budget must be at least 1 byte, got '0'")
refused(["fit", "--model", "mlp", "--budget", "-1"], "memfit fit: --budget: ")
refused(["fit", "--model", "mlp", "--budget", "64MiB", "--margin", "64MiB"],
        "memfit fit: --margin 64.00 MiB leaves nothing of --budget 64.00 MiB")
refused(["profile", "--model", "mlp", "--world-size", "0"],
        "memfit profile: --world-size expects a number of ranks >= 1")
refused(["profile", "--model", "mlp", "--world-size", "2", "--bucket-cap", "0"],
        "memfit profile: --bucket-cap must be at least 1 byte")
refused(["profile", "--model", "mlp", "--probes", "4"],
        "memfit profile: --probes needs at least two batches")
print("refused, one line each")
