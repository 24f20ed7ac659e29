"""Hostile and corrupted snapshots: the reader refuses each in one
line, in memory bounded by the file's size, without crashing; plain data
written with rarer opcodes is read. The hostile files are read in a
subprocess under an address-space limit (resource.setrlimit) a little above
what importing memfit takes."""

import json
import math
import os
import pickle
import struct
import subprocess
import sys

import pytest

import memfit
from memfit.explain import NotASnapshot

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

# Pickle opcodes, as pickletools names them.
PROTO4 = b"\x80\x04"
EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPEND, STOP = b"}", b"]", b"(", b"u", b"a", b"."


def ustr(s):
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE


def uint(n):
    return b"J" + struct.pack("<i", n) if -2**31 <= n < 2**31 else long1(n)


def long1(n):
    b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(b)]) + b


def long4(n):
    b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<i", len(b)) + b


def binbytes8(b):
    return b"\x8e" + struct.pack("<Q", len(b)) + b


def snapshot(entry_items, extra=b""):
    """{"segments": [], "device_traces": [[{entry}]]} with the entry's
    key/value opcodes as given, and `extra` key/value opcodes at the top."""
    entry = EMPTY_DICT + MARK + entry_items + SETITEMS
    return (PROTO4 + EMPTY_DICT + MARK + ustr("segments") + EMPTY_LIST
            + ustr("device_traces") + EMPTY_LIST + EMPTY_LIST + entry + APPEND + APPEND
            + extra + SETITEMS + STOP)


def entry(size=uint(512), addr=uint(4096), time_us=uint(1000), action="alloc"):
    return (ustr("action") + ustr(action) + ustr("addr") + addr + ustr("size") + size
            + ustr("stream") + uint(0) + ustr("time_us") + time_us)


def nested(depth):
    """A list nested `depth` deep: [[[...]]]."""
    return EMPTY_LIST * depth + APPEND * (depth - 1)


HOSTILE = {
    # A trace entry holding a list nested a million deep (Python's pickle reads it).
    "deep": snapshot(entry() + ustr("extra") + nested(1_000_000)),
    # 10 bytes declaring a 4 GiB string.
    "huge_string": PROTO4 + b"\x8d" + struct.pack("<Q", 4 << 30),
    "huge_unicode": PROTO4 + b"X" + struct.pack("<I", 0xFFFFFFFF),
    "huge_bytes8": PROTO4 + b"\x8e" + struct.pack("<Q", 3 << 30),
    # 5 KB of memo writes, each a million slots past the last.
    "memo": PROTO4 + EMPTY_LIST + b"".join(b"r" + struct.pack("<I", (i + 1) << 20)
                                           for i in range(1000)) + STOP,
}

CORRUPT = {
    "size_2_62": (entry(size=long1(2**62)), "trace entry 0 (alloc) has size 4611686018427387904, "
                                            "outside 0..1125899906842624 bytes"),
    "size_2_64": (entry(size=long1(2**64)), "trace entry 0 (alloc) has size <an integer wider "
                                            "than 64 bits>, not an integer"),
    "negative_size": (entry(size=uint(-5)), "trace entry 0 (alloc) has size -5, outside"),
    "time_us": (entry(time_us=long1(2**62)), "trace entry 0 (alloc) has time_us "
                                             "4611686018427387904, outside 0..4503599627370496"),
    "size_str": (entry(size=ustr("512")), "trace entry 0 (alloc) has size '512', not an integer"),
    "size_float": (entry(size=b"G" + struct.pack(">d", 512.0)),
                   "trace entry 0 (alloc) has size 512, not an integer"),
    "size_nan": (entry(size=b"G" + struct.pack(">d", math.nan)),
                 "trace entry 0 (alloc) has size nan, not an integer"),
    "addr_str": (entry(addr=ustr("0x1000")), "trace entry 0 (alloc) has addr '0x1000', not an "
                                              "integer"),
}

READ_UNDER_LIMIT = r"""
import json, resource, sys
import memfit
from memfit.explain import NotASnapshot
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
limit = vm + (768 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
out = {}
for path in sys.argv[1:]:
    try:
        s = memfit.load_snapshot(path)
        out[path] = "read: %d entries" % s.trace_entries
    except NotASnapshot as e:
        out[path] = "refused: " + str(e)
    except BaseException as e:
        out[path] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def test_hostile_files_are_refused_or_read_in_memory_bounded_by_their_size(tmp_path):
    paths = {}
    for name, content in HOSTILE.items():
        paths[name] = tmp_path / f"{name}.pickle"
        paths[name].write_bytes(content)
    # Python's own pickle reads the deep one: it is plain data.
    assert pickle.loads(HOSTILE["deep"])["device_traces"][0][0]["size"] == 512
    out = subprocess.run([sys.executable, "-c", READ_UNDER_LIMIT,
                          *(str(p) for p in paths.values())],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = {name: json.loads(out.stdout)[str(p)] for name, p in paths.items()}
    assert got["deep"] == "read: 1 entries", got
    for name in ("huge_string", "huge_unicode", "huge_bytes8"):
        assert got[name].startswith("refused: ") and "the file ends in the middle" in got[name], got
    assert "a memo index past the objects the file holds" in got["memo"], got


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_a_corrupted_field_is_refused_naming_the_entry(tmp_path, name):
    items, why = CORRUPT[name]
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(snapshot(items))
    with pytest.raises(NotASnapshot) as e:
        memfit.load_snapshot(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: a corrupted snapshot: ") and why in msg, msg
    assert "\n" not in msg


def test_the_rarer_plain_data_opcodes_are_read(tmp_path):
    settings = ustr("big") + long4(12345) + ustr("blob") + binbytes8(b"xy")
    content = snapshot(entry(size=long4(512)),
                       ustr("allocator_settings") + EMPTY_DICT + MARK + settings + SETITEMS)
    assert pickle.loads(content)["allocator_settings"] == {"big": 12345, "blob": b"xy"}
    path = tmp_path / "rare.pickle"
    path.write_bytes(content)
    s = memfit.load_snapshot(path)
    assert s.trace_entries == 1 and s.peak_allocated_bytes == 512
    assert s.raw.allocator_settings["big"] == "12345"


def test_a_directory_a_device_and_a_pipe_are_not_no_such_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, why in ((tmp_path, "a directory"), ("/dev/zero", "not a regular file"),
                      (fifo, "not a regular file")):
        with pytest.raises(NotASnapshot) as e:
            memfit.load_snapshot(path)
        assert str(e.value).startswith(f"{path}: {why}"), str(e.value)


def test_a_device_given_as_a_string_is_refused_at_the_door(tmp_path):
    with pytest.raises(TypeError) as e:
        memfit.load_snapshot(tmp_path / "x.pickle", device="0")
    assert str(e.value).startswith("[load_snapshot] device must be the CUDA device's index, "
                                   "an int"), str(e.value)


def test_the_explain_api_refuses_bad_arguments_in_one_line(tmp_path):
    path = tmp_path / "ok.pickle"
    path.write_bytes(snapshot(entry()))
    with pytest.raises(TypeError, match=r"^\[load_snapshot\] path must be the snapshot file's "
                       r"path, got NoneType None"):
        memfit.load_snapshot(None)
    s = memfit.load_snapshot(path)
    with pytest.raises(ValueError, match=r"^\[compare\] report must be what memfit.profile"):
        s.compare(None)
    with pytest.raises(ValueError, match=r"^\[table\] max_modules must be an int >= 0"):
        s.table(-1)
