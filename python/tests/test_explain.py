"""memfit explain on synthetic CUDA memory snapshots (snapshot_fixtures.py:
torch's documented format, every byte chosen here, no GPU): the reader, the
numbers, categories and places at the peak, the findings, bad input."""

import json
import pickle
import subprocess
import sys

import pytest

import memfit
from memfit.explain import NotASnapshot
from snapshot_fixtures import MiB, SnapshotBuilder, stack, training_step

U = 10 * MiB


@pytest.fixture
def step_file(tmp_path):
    return training_step().write(tmp_path / "synthetic_step.pickle")


def test_the_reader_gives_what_pickle_gives_for_every_protocol(tmp_path):
    from memfit.explain.snapshot_format import ACTIONS, read_snapshot

    b = training_step()
    b.oom(30 * MiB, 5 * MiB, stack("forward_fc1"))
    for protocol in (2, 3, 4, 5):
        path = b.write(tmp_path / f"p{protocol}.pickle", protocol=protocol)
        want = pickle.load(open(path, "rb"))
        raw = read_snapshot(path)
        (trace,) = raw.traces
        entries = want["device_traces"][0]
        assert len(trace) == len(entries)
        for i, e in enumerate(entries):
            assert ACTIONS[trace.action[i]] == e["action"]
            assert trace.addr[i] == e.get("addr", e.get("device_free"))
            assert (trace.size[i], trace.stream[i], trace.time_us[i]) == (
                e["size"], e["stream"], e["time_us"])
            got = [raw.frames[f] for f in raw.stacks[trace.stack[i]]]
            assert [(f.filename, f.line, f.name) for f in got] == [
                (f["filename"], f["line"], f["name"]) for f in e["frames"]]
        assert [(s.address, s.total_size, s.segment_type, len(s.blocks))
                for s in raw.segments] == [
            (s["address"], s["total_size"], s["segment_type"], len(s["blocks"]))
            for s in want["segments"]]
        blocks = [(b.address, b.size, b.requested_size, b.state)
                  for s in raw.segments for b in s.blocks]
        assert blocks == [(b["address"], b["size"], b["requested_size"], b["state"])
                          for s in want["segments"] for b in s["blocks"]]
        assert raw.allocator_settings["expandable_segments"] == "False"


def test_a_step_peaks_in_its_second_backward_with_the_bytes_built_in(step_file):
    s = memfit.load_snapshot(step_file)
    # See training_step(): 16 units live at iteration 2's backward temporary,
    # with the 4-byte gradient seed; 16 units of large segments + one small.
    assert s.peak_allocated_bytes == 16 * U + 4
    assert s.peak_reserved_bytes == 16 * U + 2 * MiB
    assert s.trace_complete
    assert s.categories_at_peak == {
        "parameter": 2 * U, "buffer": 0, "input": U, "activation": 4 * U, "gradient": 2 * U,
        "optimizer_state": 4 * U, "temporary": 3 * U + 4, "other": 0, "workspace": 0}
    r = s.report()
    assert (r.peak_phase, r.peak_iteration) == ("backward", 2)
    assert s.events.optimizer == "adam"


def test_places_at_the_peak_are_the_lines_that_allocated(step_file):
    s = memfit.load_snapshot(step_file)
    assert s.modules_at_peak == [
        ("", 5 * U),  # the autograd engine's thread: no Python frame
        ("train.py:33 train_step", 4 * U),  # optimizer.step(): Adam's state
        ("model.py:41 forward", 2 * U),  # fc1's output
        ("train.py:12 <module>", 2 * U),  # model.to("cuda")
        ("model.py:43 forward", U),
        ("train.py:28 train_step", U),  # x.to("cuda")
        ("train.py:31 train_step", U),  # the loss
        ("train.py:32 train_step", 4),  # loss.backward()'s seed
    ]


def test_json_carries_the_four_fields(step_file, capsys):
    from memfit.explain.cli import main

    assert main([step_file, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["peak_allocated_bytes"] == 16 * U + 4
    assert d["peak_reserved_bytes"] == 16 * U + 2 * MiB
    assert d["categories_at_peak"]["optimizer_state"] == 4 * U
    assert d["modules_at_peak"][1] == {"module": "train.py:33 train_step", "bytes": 4 * U}
    assert d["replay"]["status"] == "checked"
    assert [p["name"] for p in d["report"]["phases"]][:6] == [
        "parameters", "inputs", "forward", "loss", "backward", "optimizer_step"]


def test_the_table_and_the_page(step_file, tmp_path, capsys):
    from memfit.explain.cli import main

    page = tmp_path / "step.html"
    assert main([step_file, "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "peak allocated 160.00 MiB in backward (iteration 2); peak reserved 162.00 MiB" in out
    assert "optimizer_first_step" in out
    assert out.count("optimizer_first_step") == 1  # a finding, not also a note
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "memfit explain: synthetic_step.pickle" in html
    data = html.split('id="memfit-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["report"]["peak_bytes"] == 16 * U + 4
    assert "optimizer_first_step: the optimizer" in html
    # Guards against what was: the page had no fix lines and said "batch 0".
    assert "Fix: size the budget on the second step" in html
    assert ", batch 0," not in html and '<p class="summary">model synthetic_step.pickle, ' \
        'optimizer' in html
    # Drawn by event: the trace's idle seconds squeezed the step into the axis' end.
    assert '"x_axis":"events"' in html


def test_the_first_optimizer_step_and_kept_gradients_are_found(tmp_path):
    s = memfit.load_snapshot(training_step(grads_kept=True).write(tmp_path / "kept.pickle"))
    found = {f.kind: f for f in s.findings()}
    assert found["grads_kept"].bytes == 2 * U  # g1, g2 through iteration 2's forward
    assert "iteration 1's backward" in found["grads_kept"].seen
    assert found["optimizer_first_step"].bytes == 4 * U
    assert "the peak is in iteration 2" in found["optimizer_first_step"].seen
    # zeroing them in time (the default fixture) is not a finding
    s = memfit.load_snapshot(training_step().write(tmp_path / "fine.pickle"))
    assert "grads_kept" not in {f.kind for f in s.findings()}


def test_a_snapshots_findings_are_the_doctors_type_with_the_doctors_questions(tmp_path):
    from memfit.diagnosis.records import KINDS

    s = memfit.load_snapshot(training_step(grads_kept=True).write(tmp_path / "kept.pickle"))
    found = s.findings()
    assert found and all(type(f) is memfit.Finding for f in found)
    assert memfit.explain.Finding is memfit.Finding
    for f in found:
        assert f.as_dict()["what"] == KINDS[f.kind]


def test_the_doctors_old_names_for_bytes_and_seen_still_read_with_a_warning():
    f = memfit.Finding("peak", 10, "", "what filled it", "the fix")
    with pytest.warns(DeprecationWarning, match="Finding.bytes"):
        assert f.bytes_per_step == 10
    with pytest.warns(DeprecationWarning, match="Finding.seen"):
        assert f.evidence == "what filled it"


def test_an_oom_says_what_was_alive(tmp_path):
    b = SnapshotBuilder()
    base = 0x7F0000000000
    b.segment_alloc(base, 40 * MiB)
    b.alloc(base, 20 * MiB, stack("parameters"))
    b.segment_alloc(base + 64 * MiB, 20 * MiB)
    b.alloc(base + 64 * MiB, 12 * MiB, stack("forward_fc1"))
    b.free(base + 64 * MiB)  # the 20 MiB segment is free now
    b.segment_free(base + 64 * MiB)  # released before the retry
    b.oom(96 * MiB, 7 * MiB, stack("forward_fc2"))
    s = memfit.load_snapshot(b.write(tmp_path / "oom.pickle"))
    (oom,) = [f for f in s.findings() if f.kind == "oom"]
    assert oom.bytes == 96 * MiB
    assert oom.where == "model.py:43 forward"
    assert "asked for 96.00 MiB in forward" in oom.seen
    assert "with 20.00 MiB allocated and 40.00 MiB reserved; CUDA had 7.00 MiB free" in oom.seen
    assert "parameter 20.00 MiB (100%)" in oom.seen
    d = s.as_dict()
    assert d["ooms"] == [{"trace_index": 7, "size": 96 * MiB, "device_free": 7 * MiB,
                          "reserved_bytes": 40 * MiB}]
    assert d["peak_reserved_bytes"] == 60 * MiB


def test_an_oom_with_room_on_the_card_names_the_cap_and_the_fit_for_the_users_model(tmp_path):
    # Guards against what was: "CUDA had 138.98 GiB free" without naming the cap
    # that refused it, and `memfit fit --model` (built-in models only) as the fix.
    b = SnapshotBuilder()
    base = 0x7F0000000000
    b.segment_alloc(base, 40 * MiB)
    b.alloc(base, 20 * MiB, stack("parameters"))
    b.oom(96 * MiB, 1024 * MiB, stack("forward_fc2"))
    (oom,) = [f for f in memfit.load_snapshot(b.write(tmp_path / "cap.pickle")).findings()
              if f.kind == "oom"]
    assert ("CUDA had 1.00 GiB free, more than asked for: not the card but a cap on this "
            "process's memory refused it, at 40.00 MiB reserved") in oom.seen, oom.seen
    assert oom.fix == ("raise the cap, or fit under it: memfit.find_batch_size(model, batch, "
                       "budget='40.00MiB', target_device='cuda') finds the batch that fits; "
                       "memfit.advise(...) when even one sample does not"), oom.fix


def test_a_forward_temporary_at_the_peak_is_not_told_to_chunk_the_loss(tmp_path):
    b = SnapshotBuilder()
    base = 0x7F0000000000
    b.segment_alloc(base, 100 * MiB)
    b.alloc(base, 10 * MiB, stack("parameters"))
    b.alloc(base + 10 * MiB, 60 * MiB, stack("forward_fc1"))  # made and freed in the forward
    b.free(base + 10 * MiB)
    b.alloc(base + 10 * MiB, 1 * MiB, stack("loss"))
    (peak,) = [f for f in memfit.load_snapshot(b.write(tmp_path / "t.pickle")).findings()
               if f.kind == "peak"]
    assert "temporary 60.00 MiB" in peak.seen, peak.seen
    assert "chunked loss" not in peak.fix and "a smaller micro-batch" in peak.fix, peak.fix


def test_a_trace_that_starts_late_counts_what_was_live_before(tmp_path):
    b = SnapshotBuilder()
    base = 0x7F0000000000
    b.segment_alloc(base, 40 * MiB, record=False)  # before recording
    b.alloc(base, 20 * MiB, stack("parameters"), record=False)
    b.alloc(base + 20 * MiB, 10 * MiB, stack("parameters"), record=False)
    b.free(base + 20 * MiB)  # recorded: it was live at the start
    b.alloc(base + 20 * MiB, 15 * MiB, stack("forward_fc1"))
    s = memfit.load_snapshot(b.write(tmp_path / "late.pickle"))
    assert not s.trace_complete
    assert s.peak_allocated_bytes == 35 * MiB  # 20 + 10 live at the start, then 20 + 15
    assert s.peak_reserved_bytes == 40 * MiB
    assert s.events.pre_existing == 2
    assert s.replay().status == "incomplete"
    assert "trace_incomplete" in {f.kind for f in s.findings()}


@pytest.mark.parametrize("content, why", [
    (b"", "the file is empty"),
    (b"hello, world\n" * 10, "not a pickle of protocol 2 or later"),
    (pickle.dumps({"a": 1}), "no 'segments'"),
    (pickle.dumps([1, 2, 3]), "a segment without total_size"),
    (pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc"}]],
                   "when": __import__("datetime").date(2026, 1, 1)}), "pickle opcode"),
    (pickle.dumps({"segments": [], "device_traces": []})[:-9], "ends in the middle"),
])
def test_a_bad_file_is_one_line(tmp_path, capsys, content, why):
    from memfit.explain.cli import main

    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memfit explain: ")
    assert "not a torch memory snapshot" in err and why in err, err
    with pytest.raises(NotASnapshot):
        memfit.load_snapshot(path)


@pytest.mark.parametrize("snapshot", [
    {"segments": []},
    {"segments": [], "device_traces": [[], []]},
    [],  # _memory_viz's "segments only" form
])
def test_a_snapshot_without_a_trace_says_so(tmp_path, capsys, snapshot):
    from memfit.explain.cli import main

    path = tmp_path / "state.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "a snapshot without a trace: record_memory_history was not on" in err


def test_a_missing_file_is_one_line(tmp_path, capsys):
    from memfit.explain.cli import main

    assert main([str(tmp_path / "nope.pickle")]) == 1
    err = capsys.readouterr().err
    assert err == f"memfit explain: {tmp_path / 'nope.pickle'}: no such file\n"


def test_the_memfit_command_runs_explain(step_file):
    out = subprocess.run([sys.executable, "-m", "memfit", "explain", step_file, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["peak_allocated_bytes"] == 16 * U + 4


MEASURE = r"""
import json, resource, sys
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import memfit
base = rss()
s = memfit.load_snapshot(sys.argv[1])
print(json.dumps(dict(grown=rss() - base, peak_allocated=s.peak_allocated_bytes,
                      peak_reserved=s.peak_reserved_bytes, entries=s.trace_entries)))
"""


def test_a_large_snapshot_is_read_in_less_memory_than_the_file(tmp_path):
    # pickle.load holds 7 bytes for each byte of this file (117 MB for 16 MB:
    # every frame a dict of its own); bench/explain_memory.py measures 1 GB.
    from snapshot_fixtures import write_streamed_snapshot

    path = str(tmp_path / "big_synthetic.pickle")
    written = write_streamed_snapshot(path, 16 << 20)
    out = subprocess.run([sys.executable, "-c", MEASURE, path], capture_output=True, text=True,
                         timeout=300, env=dict(__import__("os").environ,
                                               PYTHONPATH=":".join(sys.path)))
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["entries"] == written["events"]
    assert m["peak_allocated"] == written["peak_allocated"]
    assert m["peak_reserved"] == written["segment"]
    assert m["grown"] < written["bytes"], m


def test_the_prediction_beside_a_snapshot_of_its_own_step(tmp_path):
    # A snapshot written from memfit's own recorded step (its events, frames
    # of each phase as a real run shows them): read back, its phases are the
    # step's, and the prediction's allocated bytes meet it exactly in each.
    from memfit import _memfit

    report, tl = _memfit.profile_builtin("mlp", 8, "adam", 2, 0)
    b = SnapshotBuilder()
    addr, owner = 0x7F0000000000, {}
    for kind, nbytes, ident, _, _, phase, _, _ in tl.events():
        if nbytes == 0:
            continue
        if kind == "alloc":
            seg = max(2 * MiB, (nbytes + 2 * MiB - 1) // (2 * MiB) * (2 * MiB))
            b.segment_alloc(addr, seg)
            name = {"parameters": "parameters", "inputs": "inputs", "forward": "forward_fc1",
                    "loss": "loss", "backward": "backward_main",
                    "optimizer_step": "adam_state"}[phase]
            b.alloc(addr, nbytes, stack(name))
            owner[ident] = addr
            addr += seg
        else:
            b.free(owner.pop(ident), frames_=stack("zero_grad") if phase == "zero_grad" else None)
    s = memfit.load_snapshot(b.write(tmp_path / "own.pickle"))
    c = s.compare(report, tl)
    assert [(p.phase, p.iteration) for p in c.phases] == [
        (p.name, p.iteration) for p in report.phases]
    for p, want in zip(c.phases, report.phases):
        assert p.measured_allocated == p.predicted_allocated == want.peak_bytes
    assert c.measured_peak_allocated == c.predicted_peak_allocated == report.peak_bytes
    assert c.allocated_error == 0
    assert c.predicted_peak_reserved == report.cuda.peak_reserved
    assert "backward" in c.table() and "peak" in c.table()
    assert not any(n.startswith("warning") for n in c.notes)  # the same model's parameters


def test_explain_predict_puts_the_builtin_models_prediction_beside_it(step_file, capsys):
    from memfit.explain.cli import main

    assert main([step_file, "--predict", "--model", "mlp", "--batch", "4"]) == 0
    out, err = capsys.readouterr()
    assert "measured on the card (the snapshot) beside memfit's prediction" in out
    # Guards against what was: the synthetic step's 20 MiB of parameters are not the mlp's.
    warning = ("warning: the snapshot's parameters (20.00 MiB) are not the predicted model's "
               "(2.55 MiB): this predicts another model")
    assert err.startswith("memfit explain: " + warning) and warning in out, err
    assert main([step_file, "--predict", "--model", "mlp"]) == 1
    assert "--predict needs --model NAME and --batch B" in capsys.readouterr().err
    assert main([step_file, "--predict", "--model", "mlp", "--batch", "0"]) == 1
    assert "--batch must be a positive number of samples, got 0" in capsys.readouterr().err


def test_a_snapshot_torch_writes_from_its_profiler_is_read_with_its_module_names(tmp_path):
    # torch's own writer (_memory_viz._profile_to_snapshot, a snapshot of a
    # torch.profiler run, here on the CPU): frames "path.py(LINE): function"
    # and "nn.Module: Linear_0", blocks without addresses, no segment events.
    import torch
    from torch.cuda._memory_viz import _profile_to_snapshot

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True, record_shapes=True, with_stack=True) as p:
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    snap = _profile_to_snapshot(p)
    path = tmp_path / "profiler.pickle"
    path.write_bytes(pickle.dumps(snap))
    # The peak by hand: what the trace frees without allocating it, and the
    # blocks live at the end it never allocated (their addresses laid out
    # from the segment's start, as torch's writer lays them), were live at
    # its start; then the trace's own sizes.
    (trace,) = [t for t in snap["device_traces"] if t]
    live_at_end, before = {}, 0
    for e in trace:
        if e["action"] == "alloc":
            live_at_end[e["addr"]] = e["size"]
        elif e["action"] == "free_requested" and live_at_end.pop(e["addr"], None) is None:
            before += e["size"]
    for seg in snap["segments"]:
        at = seg["address"]
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated" and at not in live_at_end:
                before += blk["size"]
            at += blk["size"]
    live = peak = before
    for e in trace:
        live += {"alloc": e["size"], "free_requested": -e["size"]}.get(e["action"], 0)
        peak = max(peak, live)
    s = memfit.load_snapshot(path)
    assert s.peak_allocated_bytes == peak
    assert not s.trace_complete
    phases = {name for name, _, _, _ in s.timeline.phase_spans()}
    assert {"forward", "backward", "optimizer_step"} <= phases
    # The activations the first forward left, by module path.
    saved = dict(s.report().modules)
    assert saved["Sequential_0.ReLU_0"] == 32 * 256 * 4  # its output, kept for backward
    assert set(saved) <= {"Sequential_0.Linear_0", "Sequential_0.ReLU_0",
                          "Sequential_0.Linear_1", "(top level)"}


def test_what_forward_makes_and_backward_keeps_is_no_activation(tmp_path):
    # The cuBLAS workspace (made at the first matmul, kept for good) is a
    # workspace, no activation; an activation dies in its iteration's
    # backward; what else forward makes and keeps is other.
    b = SnapshotBuilder()
    base = 0x7F0000000000
    b.segment_alloc(base, 40 * MiB)
    b.alloc(base, 10 * MiB, stack("parameters"))
    b.alloc(base + 10 * MiB, 8 * MiB + 128 * 1024, stack("forward_fc1"))  # the workspace
    b.alloc(base + 20 * MiB, 4 * MiB, stack("forward_fc2"))  # an activation
    b.alloc(base + 30 * MiB, 3 * MiB, stack("forward_fc2"))  # a cache the loop keeps
    b.alloc(base + 24 * MiB, 1024, stack("backward_main"))
    b.free(base + 20 * MiB)
    b.free(base + 24 * MiB)
    s = memfit.load_snapshot(b.write(tmp_path / "ws.pickle"))
    assert s.categories_at_peak["activation"] == 4 * MiB
    assert s.categories_at_peak["workspace"] == 8 * MiB + 128 * 1024
    assert s.categories_at_peak["other"] == 3 * MiB


def accumulating_steps(late_zero_grad=False, micro=2, steps=2):
    """Adam steps over `micro` micro-batches each, the gradients made by the
    first micro-batch's backward and accumulated into by the rest (a
    temporary each); zero_grad after the step, or (late_zero_grad) in the
    next step after its first forward. Each tensor its own segment."""
    b, u = SnapshotBuilder(), U
    addr, owner = [0x7F0000000000], {}

    def alloc(name, size, stack_name):
        owner[name] = a = addr[0]
        addr[0] += size + 64 * MiB
        b.segment_alloc(a, max(size, 2 * MiB))
        b.alloc(a, size, stack(stack_name))

    def free(name, stack_name=None):
        b.free(owner.pop(name), frames_=stack(stack_name) if stack_name else None)

    alloc("w1", u, "parameters")
    alloc("w2", u, "parameters")
    for s in range(steps):
        for m in range(micro):
            alloc("x", u, "inputs")
            alloc("h1", 2 * u, "forward_fc1")
            alloc("out", u, "forward_fc2")
            alloc("loss", u, "loss")
            if late_zero_grad and m == 0 and "g1" in owner:
                free("g1", "zero_grad")
                free("g2", "zero_grad")
            alloc("seed", 4, "backward_main")
            if m == 0:
                alloc("g2", u, "backward")
                alloc("g1", u, "backward")
            else:
                alloc("acc", u, "backward")
                free("acc")
            for name in ("h1", "out", "loss", "x", "seed"):
                free(name)
        if s == 0:
            for i in range(4):
                alloc(f"adam{i}", u, "adam_state")
        alloc("adam_tmp", 2 * u, "adam_tmp")
        free("adam_tmp")
        if not late_zero_grad:
            free("g1", "zero_grad")
            free("g2", "zero_grad")
    return b


def test_gradients_accumulated_between_steps_are_not_kept_gradients(tmp_path):
    s = memfit.load_snapshot(accumulating_steps().write(tmp_path / "accumulate.pickle"))
    # It said 20 MiB of gradients from the first micro-batch's backward were
    # kept through the second's forward: the accumulation itself.
    assert "grads_kept" not in {f.kind for f in s.findings()}
    late = accumulating_steps(late_zero_grad=True).write(tmp_path / "late.pickle")
    found = {f.kind: f for f in memfit.load_snapshot(late).findings()}
    assert found["grads_kept"].bytes == 2 * U  # g1, g2 through the next step's first forward
