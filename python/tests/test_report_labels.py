"""What the reports call things: meta mode says it
leaves out convolution workspace; every allocation is named by what made
it, one labelling in track(), profile() and the HTML page; the doctor
names the line that keeps a loss with its graph and suggests .item()."""

import torch
from torch import nn

import memfit


def conv_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(16 * 32 * 32, 10))


def conv_batch():
    g = torch.Generator().manual_seed(2)
    return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)


def test_meta_mode_says_it_leaves_out_convolution_workspace():
    # On the meta device no CPU step can check meta's figures (See Note
    # [Meta mode checked against the CPU's kernels]): the note says why.
    m = conv_net()
    x, y = conv_batch()
    meta = memfit.profile(conv_net().to("meta"), x.to("meta"), y.to("meta"), optimizer="adam",
                          mode="meta")
    cpu = memfit.profile(m, x, y, optimizer="adam", mode="cpu")
    assert meta.peak_bytes < cpu.peak_bytes  # what the note explains
    assert any(n.startswith("meta mode leaves out convolution workspace: the 2 convolution "
                            "layers") for n in meta.notes), meta.notes
    held = [n for n in cpu.notes if n.startswith("the CPU's convolution kernels held up to ")]
    assert len(held) == 1 and " 0 B " not in held[0], cpu.notes


def test_a_model_without_convolutions_gets_no_workspace_note():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    r = memfit.profile(m, torch.randn(4, 8), torch.randint(0, 4, (4,)), mode="meta")
    assert not any("workspace" in n for n in r.notes), r.notes


def test_track_names_every_allocation_by_what_made_it():
    m = conv_net()
    x, y = conv_batch()
    opt = torch.optim.Adam(m.parameters())
    with memfit.track(m, opt) as t:
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    modules = {name for *_, name, _op in
               [(e[0], e[6], e[7]) for e in t.timeline.events()]}
    assert "" not in modules, modules
    assert {"(loss)", "(backward)", "(optimizer)"} <= modules, modules
    assert "0 (Conv2d)" in modules and "5 (Linear)" in modules


def test_profile_and_its_page_label_layers_as_track_does(tmp_path):
    m = conv_net()
    x, y = conv_batch()
    r = memfit.profile(m, x, y, optimizer="sgd")
    paths = [p for p, _ in r.modules]
    assert "1 (ReLU)" in paths and "1" not in paths, paths
    page = r.save_html(str(tmp_path / "step.html"), predict=False)
    text = open(page, encoding="utf-8").read()
    assert "1 (ReLU)" in text


def test_doctor_names_the_append_that_keeps_the_loss_and_suggests_item(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch, torch.nn as nn\n"
        "def run(m, opt, losses):\n"
        "    for i in range(8):\n"
        "        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))\n"
        "        loss = nn.functional.cross_entropy(m(x), y)\n"
        "        loss.backward()\n"
        "        opt.step(); opt.zero_grad()\n"
        "        losses.append(loss)\n")
    namespace = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    with memfit.doctor(m, opt) as d:
        namespace["run"](m, opt, losses)
    growth = [f for f in d.findings if f.kind == "memory_growth"]
    assert len(growth) == 1, d.report()
    f = growth[0]
    assert (f.where.file, f.where.line) == (str(script), 8), d.report()
    assert f.fix.startswith("keep the number: `losses.append(loss.item())`")
    assert "made at" in f.seen and "loop.py:5" in f.seen
