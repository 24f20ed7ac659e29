"""explain_handoff.py MEMFIT: the program alone runs `memfit explain` (and
`memfit doctor`), the Python package's commands, in the Python it was built
with, as the README's one `memfit` command does, rather than exiting 1 saying
"memfit explain is in the Python package"."""
import subprocess
import sys

memfit = sys.argv[1]
done = subprocess.run([memfit, "explain", "/no/such/snapshot.pickle"], capture_output=True,
                      text=True, timeout=300)
assert done.returncode == 1, (done.returncode, done.stderr)
assert done.stderr == "memfit explain: /no/such/snapshot.pickle: no such file\n", done.stderr
done = subprocess.run([memfit, "explain", "--help"], capture_output=True, text=True, timeout=300)
assert done.returncode == 0 and "usage: memfit explain" in done.stdout, (done.stdout, done.stderr)
print("ok")
